// Data and model descriptions for Python: Tokens (the batches the package hands out), TokenLoader
// (`strata train`'s loader over a token file), the sampler's order, the byte tokenizer, and ModelConfig.
#include <pybind11/stl.h>

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "core/error.h"
#include "model/config.h"
#include "model/data_loader.h"
#include "model/loss_mask.h"
#include "model/token_file.h"
#include "model/tokenizer.h"
#include "python/binding.h"
#include "python/loader.h"

namespace strata::python {

using detail::cat;

TokenLoader::TokenLoader(const std::string& path, model::DataOptions opts)
    : file_(std::make_unique<model::TokenFile>(model::TokenFile::open(path))) {
  if (opts.source.empty()) opts.source = path;
  loader_ = std::make_unique<model::DataLoader>(*file_, opts);
  seq_len_ = opts.seq_len;
  batch_size_ = opts.batch_size;
}

Tokens TokenLoader::next() {
  const model::Batch b = loader_->next();
  // Each row's window of T + 1 tokens: its inputs, then its last target.
  const std::size_t T = std::size_t(b.seq_len), W = T + 1;
  std::vector<std::int32_t> window(std::size_t(b.rows) * W);
  for (int r = 0; r < b.rows; ++r) {
    std::copy_n(b.inputs.begin() + std::ptrdiff_t(std::size_t(r) * T), T,
                window.begin() + std::ptrdiff_t(std::size_t(r) * W));
    // The window's last token (read from the file: the loss mask may have made its target -100).
    window[std::size_t(r) * W + T] =
        std::int32_t(file_->at(std::size_t(b.sample_ids[std::size_t(r)]) * T + T));
  }
  // A loss mask or documents: the targets as the DataLoader left them out (Note [Loss mask in batches], Note
  // [Packed documents]), one column on; with documents each window's positions too.
  std::optional<std::vector<std::int32_t>> labels, positions;
  if (const model::PackedDocs* docs = file_->docs()) {
    positions.emplace(window.size());
    for (int r = 0; r < b.rows; ++r)
      docs->positions(std::size_t(b.sample_ids[std::size_t(r)]) * T, W,
                      positions->data() + std::size_t(r) * W);
  }
  if (file_->mask() || file_->docs()) {
    labels.emplace(window.size());
    for (int r = 0; r < b.rows; ++r) {
      std::int32_t* row = labels->data() + std::size_t(r) * W;
      row[0] = model::kIgnoreTarget;
      std::copy_n(b.targets.begin() + std::ptrdiff_t(std::size_t(r) * T), T, row + 1);
    }
  }
  Tokens out(std::move(window), b.rows, int(W));
  if (labels) out.set_labels(Tokens(std::move(*labels), b.rows, int(W)));
  if (positions) out.set_positions(Tokens(std::move(*positions), b.rows, int(W)));
  return out;
}

std::int64_t TokenLoader::batches_left_in_epoch() const {
  const std::int64_t per_epoch = loader_->batches_per_epoch();
  const std::int64_t returned = (loader_->position().sample + batch_size_ - 1) / batch_size_;
  return returned >= per_epoch ? per_epoch : per_epoch - returned;  // at its end: next() starts the next
}

void TokenLoader::set_epoch(std::int64_t epoch) {
  loader_->set_epoch(epoch);
}

std::int64_t TokenLoader::epoch() const {
  return loader_->position().epoch;
}

void bind_data(py::module_& m) {
  py::class_<Tokens>(m, "Tokens", py::buffer_protocol(),
                     "A (rows, cols) int32 batch of token ids; numpy.asarray(t) reads it without a copy")
      .def_buffer([](Tokens& t) {
        return py::buffer_info(const_cast<std::int32_t*>(t.data().data()), sizeof(std::int32_t),
                               py::format_descriptor<std::int32_t>::format(), 2, {t.rows(), t.cols()},
                               {sizeof(std::int32_t) * std::size_t(t.cols()), sizeof(std::int32_t)},
                               /*readonly=*/true);
      })
      .def_property_readonly("shape", [](const Tokens& t) { return py::make_tuple(t.rows(), t.cols()); })
      .def_property_readonly(
          "labels",
          [](const Tokens& t) -> std::optional<Tokens> {
            if (!t.labels()) return std::nullopt;
            return *t.labels();
          },
          "The batch's labels when its token file has a loss mask (-100 where a token does not count) or "
          "document boundaries (-100 at each document's first token), else None; engine(batch) uses them "
          "when no labels are given")
      .def_property_readonly(
          "position_ids",
          [](const Tokens& t) -> std::optional<Tokens> {
            if (!t.positions()) return std::nullopt;
            return *t.positions();
          },
          "The batch's position_ids when its token file has document boundaries (TOKENFILE.docs: 0 at each "
          "document's and row's first token), else None; engine(batch) uses them when none are given")
      .def("__len__", &Tokens::rows)
      .def("tolist",
           [](const Tokens& t) {
             py::list rows;
             for (int r = 0; r < t.rows(); ++r) {
               py::list row;
               for (int c = 0; c < t.cols(); ++c)
                 row.append(t.data()[std::size_t(r) * std::size_t(t.cols()) + std::size_t(c)]);
               rows.append(row);
             }
             return rows;
           })
      .def("__repr__",
           [](const Tokens& t) { return cat("strata.Tokens(shape=(", t.rows(), ", ", t.cols(), "))"); });

  py::class_<EpochBatches>(m, "_EpochBatches", "one epoch of a TokenLoader's batches (iter(loader))")
      .def("__iter__", [](EpochBatches& e) -> EpochBatches& { return e; })
      .def("__next__",
           [](EpochBatches& e) {
             if (e.left <= 0) throw py::stop_iteration();
             --e.left;
             py::gil_scoped_release unlocked;
             return e.loader->next();
           })
      .def("__len__", [](const EpochBatches& e) { return e.left; });

  py::class_<TokenLoader>(m, "TokenLoader",
                          "strata train's loader over a token file: (B, seq_len + 1) windows, shuffled by "
                          "(seed, epoch), this rank's share (engine.token_loader makes one)")
      .def(py::init([](const std::string& path, int batch_size, int seq_len, int rank, int world,
                       std::uint64_t seed, bool shuffle, bool drop_last_batch, std::int64_t vocab_size) {
             return std::make_unique<TokenLoader>(path, model::DataOptions{.batch_size = batch_size,
                                                                           .seq_len = seq_len,
                                                                           .rank = rank,
                                                                           .world = world,
                                                                           .seed = seed,
                                                                           .shuffle = shuffle,
                                                                           .drop_last_batch = drop_last_batch,
                                                                           .vocab_size = vocab_size});
           }),
           py::arg("path"), py::arg("batch_size"), py::arg("seq_len"), py::arg("rank") = 0,
           py::arg("world") = 1, py::arg("seed") = 1234, py::arg("shuffle") = true,
           py::arg("drop_last_batch") = true, py::arg("vocab_size") = 0)
      // `for batch in loader` is one epoch (the rest of the current one, else the next whole one), as a
      // torch DataLoader; next(loader) goes on through the epochs without end.
      .def(
          "__iter__",
          [](TokenLoader& l) {
            return EpochBatches{&l, l.batches_left_in_epoch()};
          },
          py::keep_alive<0, 1>())
      .def("__next__", &TokenLoader::next, py::call_guard<py::gil_scoped_release>())
      .def("__len__", [](const TokenLoader& l) { return l.loader().batches_per_epoch(); })
      .def("set_epoch", &TokenLoader::set_epoch, py::arg("epoch"))
      .def_property_readonly("epoch", &TokenLoader::epoch)
      .def_property_readonly("seq_len", &TokenLoader::seq_len)
      .def_property_readonly("num_samples", [](const TokenLoader& l) { return l.loader().num_samples(); })
      .def_property_readonly("samples_per_rank",
                             [](const TokenLoader& l) { return l.loader().samples_per_rank(); })
      .def("position", [](const TokenLoader& l) { return l.loader().position().to_json().dump(); });

  m.def("rank_samples", &model::rank_samples, py::arg("num_samples"), py::arg("rank"), py::arg("world"),
        py::arg("seed"), py::arg("epoch"), py::arg("shuffle"), py::arg("drop_last"),
        "This rank's sample ids of an epoch, in order (DistributedSampler's indices, Strata's permutation)");
  m.def(
      "text_to_tokens",
      [](const std::string& text, const std::string& out) {
        return model::ByteTokenizer::text_file_to_tokens(text, out);
      },
      py::arg("text_path"), py::arg("out_path"), py::call_guard<py::gil_scoped_release>(),
      "strata train --text's byte tokenizer: writes the text file's bytes as a token file; returns the "
      "count");

  using model::ModelConfig;
  py::class_<ModelConfig>(m, "ModelConfig",
                          "The sizes of a Llama-style decoder (docs/model.md): a preset, a model JSON, a "
                          "Hugging Face config.json, or fields set by hand")
      .def(py::init<>())
      .def_static("preset", &ModelConfig::preset, py::arg("name"))
      .def_static("presets", &ModelConfig::preset_names)
      .def_static("from_file", &ModelConfig::from_file, py::arg("path"))
      .def_static(
          "from_json",
          [](const std::string& text) {
            const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
            if (j.is_discarded()) throw ConfigError("ModelConfig.from_json: not valid JSON");
            return ModelConfig::from_json(j, "ModelConfig");
          },
          py::arg("text"))
      .def("to_json", [](const ModelConfig& c) { return c.to_json().dump(); })
      .def("to_hf_json", [](const ModelConfig& c) { return c.to_hf_json().dump(); })
      .def("validate", [](const ModelConfig& c) { c.validate("ModelConfig"); })
      .def("num_parameters", &ModelConfig::num_parameters)
      .def_readwrite("name", &ModelConfig::name)
      .def_readwrite("vocab_size", &ModelConfig::vocab_size)
      .def_readwrite("d_model", &ModelConfig::d_model)
      .def_readwrite("n_layers", &ModelConfig::n_layers)
      .def_readwrite("n_heads", &ModelConfig::n_heads)
      .def_readwrite("n_kv_heads", &ModelConfig::n_kv_heads)
      .def_readwrite("ffn_dim", &ModelConfig::ffn_dim)
      .def_readwrite("max_seq_len", &ModelConfig::max_seq_len)
      .def_readwrite("tie_embeddings", &ModelConfig::tie_embeddings)
      .def_readwrite("rope_theta", &ModelConfig::rope_theta)
      .def_readwrite("norm_eps", &ModelConfig::norm_eps)
      .def_readwrite("family", &ModelConfig::family)
      .def_readwrite("attention_bias", &ModelConfig::attention_bias)
      .def_readwrite("sliding_window", &ModelConfig::sliding_window)
      .def_readwrite("pad_token_id", &ModelConfig::pad_token_id)
      .def_property_readonly("head_dim", &ModelConfig::head_dim)
      .def("__eq__", [](const ModelConfig& a, const ModelConfig& b) { return a == b; })
      .def("__repr__",
           [](const ModelConfig& c) { return cat("strata.ModelConfig(", c.to_json().dump(), ")"); });
}

}  // namespace strata::python
