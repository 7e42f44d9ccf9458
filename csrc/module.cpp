// The extension module `transformer_engine_cpp._C`. Importing it loads the shared library, which
// runs the static TORCH_LIBRARY registrations; ops are then reached only as torch.ops.te_cpp.*.
// The module itself carries build information alone, through the limited Python C API (no
// pybind11, no libtorch_python), so this translation unit stays light.
#include <Python.h>

#include "common/stub_registry.h"
#include "kernels/cpu/gemm_16bit.h"
#include "kernels/cpu/lookup_count.h"
#include "kernels/cpu/stream_threshold.h"

namespace {

PyObject* built_with_cuda(PyObject*, PyObject*) {
#ifdef TECPP_WITH_CUDA
  Py_RETURN_TRUE;
#else
  Py_RETURN_FALSE;
#endif
}

PyObject* cpu_capability(PyObject*, PyObject*) {
#if defined(CPU_CAPABILITY_AVX512)
  return PyUnicode_FromString("AVX512");
#elif defined(CPU_CAPABILITY_AVX2)
  return PyUnicode_FromString("AVX2");
#else
  return PyUnicode_FromString("DEFAULT");
#endif
}

PyObject* activation_lookup_tables(PyObject*, PyObject*) {
  return PyLong_FromLongLong(te_cpp::cpu::activation_lookup_tables());
}

PyObject* activation_lookup_use(PyObject*, PyObject*) {
  return PyLong_FromLong(te_cpp::cpu::activation_lookup_use());
}

PyObject* set_activation_lookup_use(PyObject*, PyObject* arg) {
  const long use = PyLong_AsLong(arg);
  if (use == -1 && PyErr_Occurred()) return nullptr;
  if (use < -1 || use > te_cpp::cpu::kLookupAll) {
    PyErr_Format(PyExc_ValueError,
                 "set_activation_lookup_use: expected -1 (the CPU's choice) or flags 0-15 "
                 "(1: bf16 forwards, 2: bf16 backwards, 4: fp16 forwards, 8: fp16 backwards), "
                 "got %ld", use);
    return nullptr;
  }
  return PyLong_FromLong(te_cpp::cpu::set_activation_lookup_use(static_cast<int>(use)));
}

PyObject* stream_store_min_bytes(PyObject*, PyObject*) {
  return PyLong_FromLongLong(te_cpp::cpu::stream_store_min_bytes());
}

PyObject* set_stream_store_min_bytes(PyObject*, PyObject* arg) {
  const long long bytes = PyLong_AsLongLong(arg);
  if (bytes == -1 && PyErr_Occurred()) return nullptr;
  return PyLong_FromLongLong(te_cpp::cpu::set_stream_store_min_bytes(bytes));
}

PyObject* gemm_16bit_in_fp32(PyObject*, PyObject*) {
  return PyLong_FromLong(te_cpp::cpu::gemm_16bit_in_fp32_flags());
}

// [(stub name, has a CPU kernel, has a CUDA kernel)] for every backend stub of the front ends.
PyObject* kernel_stubs(PyObject*, PyObject*) {
  const auto& stubs = te_cpp::registered_stubs();
  PyObject* list = PyList_New(static_cast<Py_ssize_t>(stubs.size()));
  if (list == nullptr) return nullptr;
  for (size_t i = 0; i < stubs.size(); ++i) {
    const te_cpp::StubEntry& e = stubs[i];
    PyObject* row = Py_BuildValue("(sOO)", e.name, e.has_cpu(e.stub) ? Py_True : Py_False,
                                  e.has_cuda(e.stub) ? Py_True : Py_False);
    if (row == nullptr) {
      Py_DECREF(list);
      return nullptr;
    }
    PyList_SetItem(list, static_cast<Py_ssize_t>(i), row);  // steals row
  }
  return list;
}

PyMethodDef kMethods[] = {
    {"built_with_cuda", built_with_cuda, METH_NOARGS, "Whether the CUDA kernels were compiled."},
    {"cpu_capability", cpu_capability, METH_NOARGS, "The at::vec ISA of the CPU kernels."},
    {"activation_lookup_tables", activation_lookup_tables, METH_NOARGS,
     "How many bf16 / fp16 activation lookup tables the CPU kernels have built."},
    {"activation_lookup_use", activation_lookup_use, METH_NOARGS,
     "Which bf16 / fp16 activation calls read the lookup tables, as flags: 1 bf16 forwards, "
     "2 bf16 backwards, 4 fp16 forwards, 8 fp16 backwards."},
    {"set_activation_lookup_use", set_activation_lookup_use, METH_O,
     "Sets those flags for the process (negative: the CPU's choice); returns the value set "
     "before (negative where it was the CPU's choice)."},
    {"stream_store_min_bytes", stream_store_min_bytes, METH_NOARGS,
     "Outputs of at least this many bytes are written by the CPU kernels with non-temporal "
     "stores (default: the last-level cache's size, at most 32 MiB)."},
    {"set_stream_store_min_bytes", set_stream_store_min_bytes, METH_O,
     "Sets that threshold for the process (negative: the default); returns the value set "
     "before (-1 where it was the default)."},
    {"gemm_16bit_in_fp32", gemm_16bit_in_fp32, METH_NOARGS,
     "Which 16-bit GEMMs the CPU backend runs as ATen's fp32 GEMM (ATen has no fast GEMM for "
     "them on this CPU), as flags: 1 bf16, 2 fp16."},
    {"kernel_stubs", kernel_stubs, METH_NOARGS,
     "[(stub, has_cpu, has_cuda)] for every backend stub."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef kModule = {PyModuleDef_HEAD_INIT, "_C", "transformer_engine_cpp C++ extension", -1,
                       kMethods};

}  // namespace

PyMODINIT_FUNC PyInit__C(void) { return PyModule_Create(&kModule); }
