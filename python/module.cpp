// strata._strata: the extension module under the `strata` package (docs/python.md). The package's Python
// files give it DeepSpeed's shape; this module holds the engine, the model and the data loader.
//
// Note [Errors across the boundary]: every strata::Error raised below a bound call reaches Python as an
// exception of the package carrying the runtime's message unchanged: ConfigError -> strata.ConfigError (a
// ValueError), OutOfMemory -> strata.OutOfMemoryError (a MemoryError), IoError -> strata.IoError (an
// OSError), BackendError and the rest -> strata.StrataError (a RuntimeError, the base of all four). Check
// failures (programming errors: calls out of order) are strata::Error too, so nothing aborts the
// interpreter. Other C++ exceptions keep pybind11's own translation (std::bad_alloc -> MemoryError, ...).
#include <pybind11/pybind11.h>

#include "core/error.h"
#include "python/binding.h"

namespace strata::python {
namespace {

// The package's exception types, created once at import and kept for the process's life (a translator
// is a plain function, so they live in statics; never released, as the interpreter may already be gone
// when static destructors run).
PyObject* g_strata_error = nullptr;
PyObject* g_config_error = nullptr;
PyObject* g_oom_error = nullptr;
PyObject* g_io_error = nullptr;

PyObject* new_exception(py::module_& m, const char* name, PyObject* bases, const char* doc) {
  const std::string qualified = std::string("strata.") + name;
  PyObject* type = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases, nullptr);
  if (type == nullptr) throw py::error_already_set();
  m.add_object(name, py::reinterpret_borrow<py::object>(type));
  return type;
}

void translate(std::exception_ptr p) {
  try {
    if (p) std::rethrow_exception(p);
  } catch (const ConfigError& e) {
    PyErr_SetString(g_config_error, e.what());
  } catch (const OutOfMemory& e) {
    PyErr_SetString(g_oom_error, e.what());
  } catch (const IoError& e) {
    PyErr_SetString(g_io_error, e.what());
  } catch (const Error& e) {
    PyErr_SetString(g_strata_error, e.what());
  }
}

}  // namespace

void bind_errors(py::module_& m) {
  g_strata_error = new_exception(m, "StrataError", PyExc_RuntimeError,
                                 "An error of the Strata runtime; the message says what to change.");
  auto both = [](PyObject* a, PyObject* b) {
    PyObject* t = PyTuple_Pack(2, a, b);
    if (t == nullptr) throw py::error_already_set();
    return t;  // a new reference, kept (the type holds its bases)
  };
  g_config_error = new_exception(m, "ConfigError", both(g_strata_error, PyExc_ValueError),
                                 "Bad config, model, argument or data (a ValueError).");
  g_oom_error = new_exception(m, "OutOfMemoryError", both(g_strata_error, PyExc_MemoryError),
                              "The run does not fit the device or host memory (a MemoryError).");
  g_io_error = new_exception(m, "IoError", both(g_strata_error, PyExc_OSError),
                             "A file or NVMe operation failed (an OSError).");
  py::register_exception_translator(&translate);
}

}  // namespace strata::python

PYBIND11_MODULE(_strata, m) {
  m.doc() = "Strata's engine, model and data loader (the strata package's native part; docs/python.md)";
  strata::python::bind_errors(m);
  strata::python::bind_data(m);
  strata::python::bind_engine(m);
}
