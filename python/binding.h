// strata/python/binding.h: what the extension module's files share — token arrays in and out, and each
// file's registration function. The Python-facing contract is docs/python.md; the package's Python layer
// (python/strata/*.py) gives it DeepSpeed's shape over the classes registered here.
//
// Example (inside a bound function):
//   strata::python::TokenArray ids = strata::python::read_tokens(obj, "input_ids");  // (rows, cols)
//   std::int64_t t = ids.at(0, 1);
//   return strata::python::Tokens(std::move(window), rows, cols);  // a (rows, cols) int32 buffer
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace strata::python {

namespace py = pybind11;

// A 2-D integer array read from Python, widened to int64: (rows, cols), row-major.
struct TokenArray {
  std::vector<std::int64_t> data;
  int rows = 0, cols = 0;
  std::int64_t at(int r, int c) const { return data[std::size_t(r) * std::size_t(cols) + std::size_t(c)]; }
};

// Reads `obj` — anything with the buffer protocol (numpy, memoryview, array, Tokens) or, failing that,
// `__dlpack__` (a CPU tensor) — as a 2-D array of integers of any width and strides. ConfigError (Python:
// ValueError) naming `what` for another dimension count, a non-integer type, a device other than the CPU,
// or an object that is neither.
TokenArray read_tokens(py::handle obj, const char* what);

// A (rows, cols) int32 array the package hands out: Strata's batches. Exposes the buffer protocol, so
// numpy.asarray reads it without a copy, and goes back into engine(...) unchanged. A batch of a token file
// with a loss mask also carries its labels (rows, cols): the tokens, -100 where the mask leaves the token
// out as a target (and in column 0, never a target); engine(batch) takes them when no labels are given.
// A batch of a token file with document boundaries (TOKENFILE.docs) carries those labels (-100 at each
// document's first token too) and its position_ids (rows, cols), which engine(batch) takes likewise.
class Tokens {
 public:
  Tokens(std::vector<std::int32_t> data, int rows, int cols)
      : data_(std::move(data)), rows_(rows), cols_(cols) {}
  const std::vector<std::int32_t>& data() const { return data_; }
  int rows() const { return rows_; }
  int cols() const { return cols_; }
  const Tokens* labels() const { return labels_.get(); }  // null: no mask, the labels are the tokens
  void set_labels(Tokens labels) { labels_ = std::make_shared<const Tokens>(std::move(labels)); }
  const Tokens* positions() const { return positions_.get(); }  // null: no documents kept apart
  void set_positions(Tokens p) { positions_ = std::make_shared<const Tokens>(std::move(p)); }

 private:
  std::vector<std::int32_t> data_;  // (rows, cols)
  int rows_ = 0, cols_ = 0;
  std::shared_ptr<const Tokens> labels_, positions_;
};

// Registration, one function per file (module.cpp calls them in this order).
void bind_errors(py::module_& m);  // module.cpp
void bind_data(py::module_& m);    // data_binding.cpp: Tokens, TokenLoader, ModelConfig, samplers, text
void bind_engine(py::module_& m);  // engine_binding.cpp: Core

}  // namespace strata::python
