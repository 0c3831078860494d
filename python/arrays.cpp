// Token arrays from Python: the buffer protocol first (numpy, memoryview, array, Tokens), then DLPack
// (`__dlpack__`, for CPU tensors of libraries without the buffer protocol, such as torch).
#include <dlpack/dlpack.h>

#include <cstring>
#include <string>

#include "core/error.h"
#include "python/binding.h"

namespace strata::python {
namespace {

using detail::cat;

// One element of integer type `kind` ('i' signed, 'u' unsigned) and `bytes` wide, at p.
std::int64_t load_int(const char* p, char kind, std::size_t bytes, bool* too_big) {
  switch (bytes) {
    case 1:
      return kind == 'i' ? std::int64_t(*reinterpret_cast<const std::int8_t*>(p))
                         : std::int64_t(std::uint8_t(*p));
    case 2: {
      if (kind == 'i') {
        std::int16_t v;
        std::memcpy(&v, p, 2);
        return v;
      }
      std::uint16_t v;
      std::memcpy(&v, p, 2);
      return v;
    }
    case 4: {
      if (kind == 'i') {
        std::int32_t v;
        std::memcpy(&v, p, 4);
        return v;
      }
      std::uint32_t v;
      std::memcpy(&v, p, 4);
      return v;
    }
    default: {
      if (kind == 'i') {
        std::int64_t v;
        std::memcpy(&v, p, 8);
        return v;
      }
      std::uint64_t v;
      std::memcpy(&v, p, 8);
      if (v > std::uint64_t(INT64_MAX)) *too_big = true;
      return std::int64_t(v);
    }
  }
}

// Copies a strided 2-D integer array (strides in bytes) into a TokenArray.
TokenArray copy_2d(const char* base, std::int64_t rows, std::int64_t cols, std::int64_t stride0,
                   std::int64_t stride1, char kind, std::size_t bytes, const char* what) {
  if (rows > INT32_MAX || cols > INT32_MAX)
    throw ConfigError(cat(what, ": shape (", rows, ", ", cols, ") is too large"));
  TokenArray a;
  a.rows = int(rows);
  a.cols = int(cols);
  a.data.resize(std::size_t(rows) * std::size_t(cols));
  bool too_big = false;
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c)
      a.data[std::size_t(r * cols + c)] = load_int(base + r * stride0 + c * stride1, kind, bytes, &too_big);
  if (too_big) throw ConfigError(cat(what, ": holds a value above 2^63 - 1; token ids are small integers"));
  return a;
}

// The kind ('i' / 'u') of a struct-module format character, or 0 for a non-integer.
char format_kind(const std::string& format) {
  std::string f = format;
  if (!f.empty() && (f[0] == '<' || f[0] == '>' || f[0] == '=' || f[0] == '@' || f[0] == '!')) {
    if (f[0] == '>' || f[0] == '!') return 0;  // big-endian: not on the machines we run on
    f.erase(0, 1);
  }
  if (f.size() != 1) return 0;
  switch (f[0]) {
    case 'b':
    case 'h':
    case 'i':
    case 'l':
    case 'q':
    case 'n':
      return 'i';
    case 'B':
    case 'H':
    case 'I':
    case 'L':
    case 'Q':
    case 'N':
      return 'u';
    default:
      return 0;
  }
}

TokenArray from_buffer(py::handle obj, const char* what) {
  py::buffer_info info = py::reinterpret_borrow<py::buffer>(obj).request();
  if (info.ndim != 2)
    throw ConfigError(cat(what, ": expected a 2-D array (batch, tokens), got ", info.ndim, " dimension",
                          info.ndim == 1 ? "" : "s", "; add a batch dimension, e.g. ids[None, :]"));
  const char kind = format_kind(info.format);
  if (kind == 0 || !(info.itemsize == 1 || info.itemsize == 2 || info.itemsize == 4 || info.itemsize == 8))
    throw ConfigError(
        cat(what, ": expected integer token ids (int32 or int64), got buffer format '", info.format, "'"));
  return copy_2d(static_cast<const char*>(info.ptr), info.shape[0], info.shape[1], info.strides[0],
                 info.strides[1], kind, std::size_t(info.itemsize), what);
}

TokenArray from_dlpack(py::handle obj, const char* what) {
  py::object capsule = obj.attr("__dlpack__")();
  PyObject* cap = capsule.ptr();
  if (!PyCapsule_IsValid(cap, "dltensor"))
    throw ConfigError(cat(what, ": __dlpack__() did not return an unconsumed \"dltensor\" capsule"));
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap, "dltensor"));
  // The consumer owns the tensor from here: rename the capsule (so that its destructor does not free
  // it) and call the deleter when done, error or not.
  PyCapsule_SetName(cap, "used_dltensor");
  struct Release {
    DLManagedTensor* t;
    ~Release() {
      if (t->deleter) t->deleter(t);
    }
  } release{managed};
  const DLTensor& t = managed->dl_tensor;
  if (t.device.device_type != kDLCPU && t.device.device_type != kDLCUDAHost)
    throw ConfigError(cat(what, ": the tensor is on device type ", int(t.device.device_type),
                          ", not the CPU; move it to the CPU first (e.g. .cpu())"));
  if (t.ndim != 2)
    throw ConfigError(cat(what, ": expected a 2-D array (batch, tokens), got ", t.ndim, " dimensions"));
  const bool is_int = t.dtype.code == kDLInt || t.dtype.code == kDLUInt;
  const int bits = t.dtype.bits;
  if (!is_int || t.dtype.lanes != 1 || !(bits == 8 || bits == 16 || bits == 32 || bits == 64))
    throw ConfigError(cat(what, ": expected integer token ids (int32 or int64), got DLPack type code ",
                          int(t.dtype.code), " with ", bits, " bits"));
  const std::int64_t bytes = bits / 8;
  const std::int64_t s1 = t.strides ? t.strides[1] * bytes : bytes;
  const std::int64_t s0 = t.strides ? t.strides[0] * bytes : t.shape[1] * bytes;
  return copy_2d(static_cast<const char*>(t.data) + t.byte_offset, t.shape[0], t.shape[1], s0, s1,
                 t.dtype.code == kDLInt ? 'i' : 'u', std::size_t(bytes), what);
}

}  // namespace

TokenArray read_tokens(py::handle obj, const char* what) {
  if (PyObject_CheckBuffer(obj.ptr())) return from_buffer(obj, what);
  if (py::hasattr(obj, "__dlpack__")) return from_dlpack(obj, what);
  throw ConfigError(cat(what, ": expected a 2-D integer array (numpy, memoryview, anything with the buffer ",
                        "protocol or __dlpack__), got ",
                        std::string(py::str(py::type::of(obj).attr("__name__")))));
}

}  // namespace strata::python
