// fuselab's launcher of compiled Triton kernels: one C call from Python per launch, no Triton in between.
//
// A `Launcher` stands for one Triton kernel at one set of compile-time options (constexprs, num_warps, ...). Triton
// compiles one binary per *specialization* of the runtime arguments: each pointer's element type and 16-byte
// alignment, each integer's width (i32 / i64 / u64), whether it is 1 (then a constant) and whether it is a multiple
// of 16. `launch` reads that specialization from the arguments themselves (`key`, one byte per argument, finer than
// Triton's, so two calls with the same key can share a binary), finds the binary registered for it (`add`, from
// Python, after Triton compiled and ran the first call of that key) and launches it with cuLaunchKernel on the given
// stream. It returns the key, launching nothing, when no binary is registered for it (Python then launches through
// Triton and registers the binary, or `refuse`s the key), and None when an argument is of a kind it does not pass or
// the key was refused (Python stays with Triton for that call).
//
// Arguments: CUDA tensors (anything with is_cuda, data_ptr() and dtype; dtypes numbered by `dtypes` given at
// creation), Python ints, bools, floats and None, and Triton's host-side TensorDescriptors (the type given at
// creation): for those the key holds the base's dtype, the rank, the padding and the block shape, and the launch
// encodes the CUtensorMap (cuTensorMapEncodeTiled, as Triton's launcher does, with the binary's swizzle and block) and
// passes it, then the shape (i32) and the strides (i64), as Triton 3.6's kernels take a descriptor argument. No torch
// headers: it builds with any C compiler against Python.h, and libcuda is opened at the first launch (dlopen), so the
// module loads and computes keys on machines without a GPU.
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <structmember.h>

#include "launcher_api.h"

#define MAX_ARGS 64
#define MAX_DESCS 16  // tensor descriptors in one launch
#define MAX_RANK 5    // a tensor descriptor's rank (TMA's limit)

typedef int CUresult;
typedef CUresult (*LaunchKernelFn)(void* function, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                   unsigned bz, unsigned shared, void* stream, void** params, void** extra);
typedef CUresult (*GetErrorStringFn)(CUresult, const char**);
typedef CUresult (*CtxGetCurrentFn)(void** context);
typedef CUresult (*StreamIsCapturingFn)(void* stream, int* status);  // status: CUstreamCaptureStatus, 0 when none
typedef CUresult (*TensorMapEncodeTiledFn)(void* map, int dtype, unsigned rank, void* address, const uint64_t* dims,
                                           const uint64_t* strides, const unsigned* box, const unsigned* element_strides,
                                           int interleave, int swizzle, int l2_promotion, int oob_fill);

static LaunchKernelFn cu_launch_kernel = NULL;
static GetErrorStringFn cu_get_error_string = NULL;
static CtxGetCurrentFn cu_ctx_get_current = NULL;
static StreamIsCapturingFn cu_stream_is_capturing = NULL;
static TensorMapEncodeTiledFn cu_tensor_map_encode_tiled = NULL;  // NULL with a driver before CUDA 12
static PyObject* str_data_ptr = NULL;
static PyObject* str_dtype = NULL;
static PyObject* str_is_cuda = NULL;
static PyObject* str_get_device = NULL;
static PyObject* str_shape = NULL;
static PyObject* str_stride = NULL;
static PyObject* str_requires_grad = NULL;
static PyObject* str_base = NULL;
static PyObject* str_block_shape = NULL;
static PyObject* str_padding = NULL;
static PyObject* str_strides = NULL;

// Whether Replayer.call may replay (`set_enabled`: fuselab.ops.launcher.enabled), and how deep this thread is in
// recordings (`recording`: a fused op called inside another's recorded forward runs its own Python, so that the outer
// recording sees its launches).
static int replays_on = 1;
static _Thread_local int recording_depth = 0;

// Argument kinds, in a binary's layout (one char per argument of the call): how its value is passed.
enum {
  PASS_SKIP = '-',   // a constant of the binary (an int equal to 1, None): not passed
  PASS_PTR = 'p',    // a device pointer (8 bytes)
  PASS_I32 = 'i',
  PASS_I64 = 'l',
  PASS_U64 = 'K',
  PASS_U8 = 'B',     // a bool (u1)
  PASS_F32 = 'f',
  PASS_DESC = 'D',   // a TensorDescriptor: the CUtensorMap (128 bytes), its shape (i32 each), its strides (i64 each)
};

// Key bytes: one per argument.
enum {
  KEY_NONE = 1,
  KEY_FLOAT = 2,
  KEY_FALSE = 3,
  KEY_TRUE = 4,
  KEY_DESC = 5,     // a TensorDescriptor; its tail (after the arguments' bytes): dtype number, rank, padding ("nan":
                    // 1), the block shape (2 bytes a dim)
  KEY_INT = 16,     // | width (0 i32, 1 i64, 2 u64) << 2 | (value == 1) << 1 | (value % 16 == 0)
  KEY_TENSOR = 64,  // | dtype number << 1 | (address % 16 == 0); dtype numbers < 32
};

static int load_driver(void) {
  if (cu_launch_kernel != NULL) return 0;
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (lib == NULL) lib = dlopen("libcuda.so", RTLD_NOW | RTLD_GLOBAL);
  if (lib == NULL) {
    PyErr_SetString(PyExc_RuntimeError, "fuselab launcher: cannot open libcuda.so.1 (no NVIDIA driver?)");
    return -1;
  }
  cu_get_error_string = (GetErrorStringFn)dlsym(lib, "cuGetErrorString");
  cu_ctx_get_current = (CtxGetCurrentFn)dlsym(lib, "cuCtxGetCurrent");
  cu_stream_is_capturing = (StreamIsCapturingFn)dlsym(lib, "cuStreamIsCapturing");
  cu_launch_kernel = (LaunchKernelFn)dlsym(lib, "cuLaunchKernel");
  cu_tensor_map_encode_tiled = (TensorMapEncodeTiledFn)dlsym(lib, "cuTensorMapEncodeTiled");
  if (cu_launch_kernel == NULL || cu_ctx_get_current == NULL) {
    PyErr_SetString(PyExc_RuntimeError, "fuselab launcher: libcuda has no cuLaunchKernel or cuCtxGetCurrent");
    return -1;
  }
  return 0;
}

// What `table` (a dict: key -> entry, or None for a refused key) holds for `key` (a new reference, taken): 1 with
// *entry (borrowed) when it holds one; 0 with *answer what the caller returns (the key itself, given back, when it
// holds nothing; None for a refused key); -1 on an error.
static int look_up(PyObject* table, PyObject* key, PyObject** entry, PyObject** answer) {
  PyObject* found = PyDict_GetItemWithError(table, key);  // borrowed
  if (found == NULL) {
    if (PyErr_Occurred()) {
      Py_DECREF(key);
      return -1;
    }
    *answer = key;
    return 0;
  }
  Py_DECREF(key);
  if (found == Py_None) {
    *answer = Py_NewRef(Py_None);
    return 0;
  }
  *entry = found;
  return 1;
}

// Whether `a` says it is on a CUDA device (is_cuda is True); anything without is_cuda: no.
static int on_gpu(PyObject* a) {
  PyObject* flag = PyObject_GetAttr(a, str_is_cuda);
  if (flag == NULL) {
    PyErr_Clear();
    return 0;
  }
  Py_DECREF(flag);
  return flag == Py_True;
}

// ------------------------------------------------------------------------------------------------ a binary

// How a binary takes one tensor descriptor (Triton's tensordesc_meta): the CUtensorMap's swizzle, element size and
// type (the driver's enum), the box (block) shape, outermost dim first.
typedef struct {
  int swizzle;
  int elem_size;
  int elem_type;
  int rank;
  unsigned block[MAX_RANK];
} DescMeta;

// A tensor descriptor as a call gives it: the base address, shape and strides (elements), outermost first; padding
// 1 for "nan" (out-of-bounds reads give NaN), 0 for "zero".
typedef struct {
  uint64_t base;
  int32_t rank;
  int32_t padding;
  int64_t shape[MAX_RANK];
  int64_t strides[MAX_RANK];
} DescArg;

typedef struct {
  PyObject_HEAD
  void* function;        // CUfunction, loaded by Triton in the device's primary context
  unsigned block;        // threads per program (32 * num_warps)
  unsigned shared;       // dynamic shared memory, bytes
  Py_ssize_t n_args;     // arguments of the call
  char layout[MAX_ARGS]; // PASS_* per argument
  int n_descs;           // PASS_DESC arguments, in order: metas
  DescMeta metas[MAX_DESCS];
} Binary;

// A CUtensorMap: 128 opaque bytes, 64-byte aligned.
typedef struct {
  _Alignas(64) uint64_t opaque[16];
} TensorMap;

static PyTypeObject BinaryType;

// ------------------------------------------------------------------------------------------------ the launcher

typedef struct {
  PyObject_HEAD
  PyObject* dtypes;           // dict: dtype object -> int < 32
  PyObject* descriptor_type;  // Triton's TensorDescriptor class, or None (no descriptor is passed)
  PyObject* binaries;         // dict: key (bytes: device index, one byte per argument, descriptors' tails) -> Binary
} Launcher;

// The most bytes a key holds: the device, one a argument, a tail a descriptor.
#define KEY_BYTES (1 + MAX_ARGS + MAX_DESCS * (3 + 2 * MAX_RANK))

// A sequence of 1 to MAX_RANK Python ints into out: its length, 0 when it is not one, -1 on a Python error.
static int read_dims(PyObject* seq_obj, int64_t* out) {
  PyObject* seq = PySequence_Fast(seq_obj, "");
  if (seq == NULL) {
    PyErr_Clear();
    return 0;
  }
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  int ok = n >= 1 && n <= MAX_RANK;
  for (Py_ssize_t i = 0; ok && i < n; i++) {
    PyObject* v = PySequence_Fast_GET_ITEM(seq, i);
    if (!PyLong_Check(v)) {
      ok = 0;
      break;
    }
    out[i] = PyLong_AsLongLong(v);
    if (out[i] == -1 && PyErr_Occurred()) {
      Py_DECREF(seq);
      return -1;
    }
  }
  Py_DECREF(seq);
  return ok ? (int)n : 0;
}

// A TensorDescriptor into *d and its key tail into tail (*tail_len bytes): 1, 0 when the launcher does not pass it
// (a base not on a CUDA device, of another dtype, not 16-byte aligned; a block past 65535), -1 on a Python error.
static int read_descriptor(Launcher* self, PyObject* a, DescArg* d, unsigned char* tail, int* tail_len) {
  int64_t block[MAX_RANK];
  PyObject* base = PyObject_GetAttr(a, str_base);
  if (base == NULL) return -1;
  int ok = on_gpu(base);
  long code = -1;
  if (ok) {
    PyObject* dtype = PyObject_GetAttr(base, str_dtype);
    PyObject* found = dtype == NULL ? NULL : PyDict_GetItemWithError(self->dtypes, dtype);  // borrowed
    Py_XDECREF(dtype);
    if (found == NULL && PyErr_Occurred()) PyErr_Clear();
    code = found == NULL ? -1 : PyLong_AsLong(found);
    ok = code >= 0;
  }
  if (ok) {
    PyObject* ptr = PyObject_CallMethodNoArgs(base, str_data_ptr);
    if (ptr == NULL) {
      Py_DECREF(base);
      return -1;
    }
    d->base = PyLong_AsUnsignedLongLong(ptr);
    Py_DECREF(ptr);
    if (d->base == (uint64_t)-1 && PyErr_Occurred()) ok = -1;
    else ok = d->base % 16 == 0;
  }
  Py_DECREF(base);
  if (ok <= 0) return ok;
  PyObject* names[3] = {str_shape, str_strides, str_block_shape};
  int64_t* into[3] = {d->shape, d->strides, block};
  int rank = -1;
  for (int f = 0; f < 3; f++) {
    PyObject* dims = PyObject_GetAttr(a, names[f]);
    if (dims == NULL) return -1;
    int got = read_dims(dims, into[f]);
    Py_DECREF(dims);
    if (got <= 0) return got;
    if (rank >= 0 && got != rank) return 0;
    rank = got;
  }
  PyObject* padding = PyObject_GetAttr(a, str_padding);
  if (padding == NULL) return -1;
  d->padding = PyUnicode_Check(padding) && PyUnicode_CompareWithASCIIString(padding, "nan") == 0;
  Py_DECREF(padding);
  d->rank = rank;
  tail[0] = (unsigned char)code;
  tail[1] = (unsigned char)rank;
  tail[2] = (unsigned char)d->padding;
  for (int r = 0; r < rank; r++) {
    if (block[r] < 1 || block[r] > 65535) return 0;
    tail[3 + 2 * r] = (unsigned char)(block[r] & 0xff);
    tail[4 + 2 * r] = (unsigned char)(block[r] >> 8);
  }
  *tail_len = 3 + 2 * rank;
  return 1;
}

// The key of `args` on device `device` into buf (*key_len bytes: the device, one byte per argument, then each
// descriptor's tail); the argument values a binary passes into values (a descriptor's: its index in descs).
// Returns 1, 0 when an argument is of a kind the launcher does not pass, -1 on a Python error.
static int read_args(Launcher* self, PyObject* const* args, Py_ssize_t n, int device, unsigned char* buf,
                     Py_ssize_t* key_len, uint64_t* values, DescArg* descs) {
  buf[0] = (unsigned char)device;
  Py_ssize_t len = 1 + n;
  int n_descs = 0;
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject* a = args[i];
    unsigned char k;
    values[i] = 0;
    if (a == Py_None) {
      k = KEY_NONE;
    } else if (PyBool_Check(a)) {
      k = a == Py_True ? KEY_TRUE : KEY_FALSE;
      values[i] = a == Py_True;
    } else if (PyLong_Check(a)) {
      int overflow = 0;
      long long v = PyLong_AsLongLongAndOverflow(a, &overflow);
      if (v == -1 && PyErr_Occurred()) return -1;
      int width;
      uint64_t bits;
      if (overflow == 0) {
        width = (v >= INT32_MIN && v <= INT32_MAX) ? 0 : 1;
        bits = (uint64_t)v;
      } else if (overflow > 0) {
        unsigned long long u = PyLong_AsUnsignedLongLong(a);
        if (u == (unsigned long long)-1 && PyErr_Occurred()) {
          PyErr_Clear();
          return 0;  // past 64 bits
        }
        width = 2;
        bits = u;
      } else {
        return 0;  // below -2^63
      }
      k = KEY_INT | width << 2 | (bits == 1) << 1 | (bits % 16 == 0);
      values[i] = bits;
    } else if (PyFloat_Check(a)) {
      k = KEY_FLOAT;
      float f = (float)PyFloat_AS_DOUBLE(a);
      memcpy(&values[i], &f, sizeof f);
    } else if ((PyObject*)Py_TYPE(a) == self->descriptor_type) {
      if (n_descs == MAX_DESCS) return 0;
      int tail_len = 0;
      int ok = read_descriptor(self, a, &descs[n_descs], buf + len, &tail_len);
      if (ok <= 0) return ok;
      k = KEY_DESC;
      values[i] = (uint64_t)n_descs++;
      len += tail_len;
    } else {
      if (!on_gpu(a)) return 0;  // a CPU tensor goes to Triton, which refuses it
      PyObject* dtype = PyObject_GetAttr(a, str_dtype);
      if (dtype == NULL) {
        PyErr_Clear();
        return 0;
      }
      PyObject* code = PyDict_GetItemWithError(self->dtypes, dtype);  // borrowed
      Py_DECREF(dtype);
      if (code == NULL) {
        if (PyErr_Occurred()) PyErr_Clear();
        return 0;
      }
      PyObject* ptr = PyObject_CallMethodNoArgs(a, str_data_ptr);
      if (ptr == NULL) {
        PyErr_Clear();
        return 0;
      }
      unsigned long long address = PyLong_AsUnsignedLongLong(ptr);
      Py_DECREF(ptr);
      if (address == (unsigned long long)-1 && PyErr_Occurred()) return -1;
      k = KEY_TENSOR | (unsigned char)(PyLong_AsLong(code) << 1) | (address % 16 == 0);
      values[i] = address;
    }
    buf[1 + i] = k;
  }
  *key_len = len;
  return 1;
}

static PyObject* make_key(Launcher* self, PyObject* const* args, Py_ssize_t n, int device, uint64_t* values,
                          DescArg* descs) {
  unsigned char buf[KEY_BYTES];
  Py_ssize_t len = 0;
  if (n > MAX_ARGS) Py_RETURN_NONE;
  int ok = read_args(self, args, n, device, buf, &len, values, descs);
  if (ok < 0) return NULL;
  if (ok == 0) Py_RETURN_NONE;
  return PyBytes_FromStringAndSize((const char*)buf, len);
}

// The CUtensorMap of descriptor `d` as binary meta `m` takes it, into *map (as Triton's fill_tma_descriptor: dims
// innermost first, byte strides of the outer dims, L2 promotion 128 B, no interleave): 0; -1 with a message in error.
static int encode_descriptor(const DescMeta* m, const DescArg* d, TensorMap* map, char* error, size_t error_len) {
  uint64_t dims[MAX_RANK], strides[MAX_RANK];
  unsigned box[MAX_RANK], element_strides[MAX_RANK] = {1, 1, 1, 1, 1};
  int rank = d->rank;
  if (rank != m->rank) {
    snprintf(error, error_len, "fuselab launcher: a tensor descriptor of rank %d for a binary of rank %d", rank,
             m->rank);
    return -1;
  }
  for (int i = 0; i < rank; i++) {
    dims[rank - 1 - i] = (uint64_t)d->shape[i];
    box[rank - 1 - i] = m->block[i];
  }
  for (int i = 0; i + 1 < rank; i++) strides[rank - 2 - i] = (uint64_t)(d->strides[i] * m->elem_size);
  if (cu_tensor_map_encode_tiled == NULL) {
    snprintf(error, error_len, "fuselab launcher: the driver has no cuTensorMapEncodeTiled");
    return -1;
  }
  CUresult err = cu_tensor_map_encode_tiled(map, m->elem_type, (unsigned)rank, (void*)(uintptr_t)d->base, dims,
                                            strides, box, element_strides, 0, m->swizzle, 2, d->padding ? 1 : 0);
  if (err != 0) {
    const char* msg = NULL;
    if (cu_get_error_string != NULL) cu_get_error_string(err, &msg);
    snprintf(error, error_len, "fuselab launcher: cuTensorMapEncodeTiled failed: %s (CUresult %d)",
             msg ? msg : "unknown error", err);
    return -1;
  }
  return 0;
}

// Launch binary `b` on `grid` with the argument values of `values` (one per argument, as read_args reads them; a
// descriptor's, its index in descs) on `stream`, with no Python (the driver loaded): 0; -1 with a message in error
// (error_len bytes at most).
static int launch_raw(Binary* b, const unsigned long long grid[3], const uint64_t* values, const DescArg* descs,
                      void* stream, char* error, size_t error_len) {
  if (grid[0] == 0 || grid[1] == 0 || grid[2] == 0) return 0;  // nothing to run, as Triton
  if (grid[0] > 0x7fffffffULL || grid[1] > 65535 || grid[2] > 65535) {
    snprintf(error, error_len, "fuselab launcher: grid (%llu, %llu, %llu) is past the GPU's limits", grid[0], grid[1],
             grid[2]);
    return -1;
  }
  // Parameters in the binary's order: the passed arguments, then Triton's two scratch pointers (null: a binary that
  // needs scratch memory is never registered).
  int32_t i32[MAX_ARGS];
  uint8_t u8[MAX_ARGS];
  float f32[MAX_ARGS];
  uint64_t wide[MAX_ARGS];
  uint64_t scratch[2] = {0, 0};
  TensorMap maps[MAX_DESCS];
  int32_t desc_shapes[MAX_DESCS * MAX_RANK];
  int64_t desc_strides[MAX_DESCS * MAX_RANK];
  void* params[MAX_ARGS + 2 + 2 * MAX_DESCS * MAX_RANK];
  int p = 0, j = 0;
  for (Py_ssize_t i = 0; i < b->n_args; i++) {
    switch (b->layout[i]) {
      case PASS_SKIP:
        break;
      case PASS_DESC: {
        const DescArg* d = &descs[values[i]];
        if (j >= b->n_descs || encode_descriptor(&b->metas[j], d, &maps[j], error, error_len) < 0) {
          if (j >= b->n_descs) snprintf(error, error_len, "fuselab launcher: more descriptors than the binary takes");
          return -1;
        }
        params[p++] = &maps[j];
        for (int r = 0; r < d->rank; r++) {
          desc_shapes[j * MAX_RANK + r] = (int32_t)d->shape[r];
          params[p++] = &desc_shapes[j * MAX_RANK + r];
        }
        for (int r = 0; r < d->rank; r++) {
          desc_strides[j * MAX_RANK + r] = d->strides[r];
          params[p++] = &desc_strides[j * MAX_RANK + r];
        }
        j++;
        break;
      }
      case PASS_I32:
        i32[i] = (int32_t)values[i];
        params[p++] = &i32[i];
        break;
      case PASS_U8:
        u8[i] = (uint8_t)values[i];
        params[p++] = &u8[i];
        break;
      case PASS_F32:
        memcpy(&f32[i], &values[i], sizeof(float));
        params[p++] = &f32[i];
        break;
      default:  // pointers and 64-bit integers
        wide[i] = values[i];
        params[p++] = &wide[i];
        break;
    }
  }
  params[p++] = &scratch[0];
  params[p++] = &scratch[1];
  if (cu_launch_kernel == NULL) {
    snprintf(error, error_len, "fuselab launcher: the CUDA driver is not loaded");
    return -1;
  }
  CUresult err = cu_launch_kernel(b->function, (unsigned)grid[0], (unsigned)grid[1], (unsigned)grid[2], b->block, 1,
                                  1, b->shared, stream, params, NULL);
  if (err != 0) {
    const char* msg = NULL;
    if (cu_get_error_string != NULL) cu_get_error_string(err, &msg);
    snprintf(error, error_len, "fuselab launcher: cuLaunchKernel failed: %s (CUresult %d)", msg ? msg : "unknown error",
             err);
    return -1;
  }
  return 0;
}

// launch_raw, its failure a Python RuntimeError (a grid past the limits: ValueError): 0 or -1.
static int launch_binary(Binary* b, const unsigned long long grid[3], const uint64_t* values, const DescArg* descs,
                         void* stream) {
  char error[256];
  if (load_driver() < 0) return -1;
  if (launch_raw(b, grid, values, descs, stream, error, sizeof error) == 0) return 0;
  int past = grid[0] > 0x7fffffffULL || grid[1] > 65535 || grid[2] > 65535;
  PyErr_SetString(past ? PyExc_ValueError : PyExc_RuntimeError, error);
  return -1;
}

// launch(grid, device, stream, *args) -> True (launched); the key (bytes) when nothing is registered for it (Python
// launches through Triton and registers the binary, or refuses the key); None when an argument, or the grid, is of a
// kind the launcher does not pass, or the key was refused (Python launches through Triton). grid: a tuple or list of
// 1 to 3 Python ints.
static PyObject* Launcher_launch(Launcher* self, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs < 3) {
    PyErr_SetString(PyExc_TypeError, "launch(grid, device, stream, *args)");
    return NULL;
  }
  unsigned long long grid[3] = {1, 1, 1};
  PyObject* g = args[0];
  if (!(PyTuple_CheckExact(g) || PyList_CheckExact(g))) Py_RETURN_NONE;  // a function of the meta-parameters
  Py_ssize_t dims = PySequence_Fast_GET_SIZE(g);
  if (dims < 1 || dims > 3) Py_RETURN_NONE;
  for (Py_ssize_t d = 0; d < dims; d++) {
    PyObject* v = PySequence_Fast_GET_ITEM(g, d);
    if (!PyLong_CheckExact(v)) Py_RETURN_NONE;
    grid[d] = PyLong_AsUnsignedLongLong(v);
    if (grid[d] == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
  }
  long device = PyLong_AsLong(args[1]);
  if (device == -1 && PyErr_Occurred()) return NULL;
  void* stream = PyLong_AsVoidPtr(args[2]);
  if (stream == NULL && PyErr_Occurred()) return NULL;
  Py_ssize_t n = nargs - 3;
  uint64_t values[MAX_ARGS];
  DescArg descs[MAX_DESCS];
  PyObject* key = make_key(self, args + 3, n, (int)device, values, descs);
  if (key == NULL || key == Py_None) return key;
  PyObject *found, *answer;
  int held = look_up(self->binaries, key, &found, &answer);  // refused: Triton launches it
  if (held <= 0) return held < 0 ? NULL : answer;
  if (launch_binary((Binary*)found, grid, values, descs, stream) < 0) return NULL;
  Py_RETURN_TRUE;
}

// key(device, *args) -> bytes, or None (an argument the launcher does not pass).
static PyObject* Launcher_key(Launcher* self, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs < 1) {
    PyErr_SetString(PyExc_TypeError, "key(device, *args)");
    return NULL;
  }
  long device = PyLong_AsLong(args[0]);
  if (device == -1 && PyErr_Occurred()) return NULL;
  uint64_t values[MAX_ARGS];
  DescArg descs[MAX_DESCS];
  return make_key(self, args + 1, nargs - 1, (int)device, values, descs);
}

// binary(device, *args) -> the Binary registered for the key of `args`, or None.
static PyObject* Launcher_binary(Launcher* self, PyObject* const* args, Py_ssize_t nargs) {
  PyObject* key = Launcher_key(self, args, nargs);
  if (key == NULL || key == Py_None) return key;
  PyObject* found = PyDict_GetItemWithError(self->binaries, key);  // borrowed
  Py_DECREF(key);
  if (found == NULL) {
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
  }
  Py_INCREF(found);
  return found;  // None for a refused key
}

// values(device, *args) -> bytes: the 8-byte values launch passes for `args` (as read_args reads them), then its
// descriptors (a DescArg each), or None.
static PyObject* Launcher_values(Launcher* self, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs < 1 || nargs - 1 > MAX_ARGS) {
    PyErr_SetString(PyExc_TypeError, "values(device, *args), at most 64 args");
    return NULL;
  }
  uint64_t values[MAX_ARGS + MAX_DESCS * (sizeof(DescArg) / sizeof(uint64_t))];
  DescArg descs[MAX_DESCS];
  unsigned char buf[KEY_BYTES];
  Py_ssize_t len = 0, n = nargs - 1;
  int ok = read_args(self, args + 1, n, 0, buf, &len, values, descs);
  if (ok < 0) return NULL;
  if (ok == 0) Py_RETURN_NONE;
  Py_ssize_t n_descs = 0;
  for (Py_ssize_t i = 0; i < n; i++) n_descs += buf[1 + i] == KEY_DESC;
  memcpy(values + n, descs, n_descs * sizeof(DescArg));
  return PyBytes_FromStringAndSize((const char*)values, n * (Py_ssize_t)sizeof(uint64_t) + n_descs * sizeof(DescArg));
}

// The descriptors' metas of `add`, (swizzle, elem_size, elem_type, block shape) each, into b: 0, -1 (a ValueError).
static int read_metas(PyObject* descs, Binary* b) {
  PyObject* seq = PySequence_Fast(descs, "descs must be a sequence");
  if (seq == NULL) return -1;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  int ok = n <= MAX_DESCS;
  for (Py_ssize_t j = 0; ok && j < n; j++) {
    DescMeta* m = &b->metas[j];
    PyObject* block;
    int64_t dims[MAX_RANK];
    ok = PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, j), "iiiO", &m->swizzle, &m->elem_size, &m->elem_type,
                          &block);
    if (!ok) break;
    m->rank = read_dims(block, dims);
    ok = m->rank > 0;
    for (int r = 0; ok && r < m->rank; r++) {
      ok = dims[r] >= 1 && dims[r] <= 256;  // TMA's box limit
      m->block[r] = (unsigned)dims[r];
    }
  }
  Py_DECREF(seq);
  if (!ok) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "fuselab launcher: a descriptor's meta is not valid");
    return -1;
  }
  b->n_descs = (int)n;
  return 0;
}

// add(key, function, num_warps, shared, layout, descs=()): register a binary for `key` (from `key`); descs: per 'D'
// of the layout, how the binary takes that descriptor (swizzle, elem_size, elem_type: the driver's enum, block).
static PyObject* Launcher_add(Launcher* self, PyObject* args) {
  PyObject* key;
  PyObject* descs = NULL;
  unsigned long long function;
  unsigned num_warps, shared;
  const char* layout;
  Py_ssize_t layout_len;
  if (!PyArg_ParseTuple(args, "SKIIs#|O", &key, &function, &num_warps, &shared, &layout, &layout_len, &descs))
    return NULL;
  if (layout_len > MAX_ARGS) {
    PyErr_SetString(PyExc_ValueError, "fuselab launcher: more arguments than it passes");
    return NULL;
  }
  Py_ssize_t n_d = 0;
  for (Py_ssize_t i = 0; i < layout_len; i++) {
    if (layout[i] == '\0' || !strchr("-pilKBfD", layout[i])) {  // strchr finds the string's own NUL too
      PyErr_Format(PyExc_ValueError, "fuselab launcher: unknown layout char %c", layout[i]);
      return NULL;
    }
    n_d += layout[i] == PASS_DESC;
  }
  Binary* b = PyObject_New(Binary, &BinaryType);
  if (b == NULL) return NULL;
  b->n_descs = 0;
  if (descs != NULL && read_metas(descs, b) < 0) {
    Py_DECREF(b);
    return NULL;
  }
  Py_ssize_t key_len = 1 + layout_len;
  for (int j = 0; j < b->n_descs; j++) key_len += 3 + 2 * b->metas[j].rank;
  if (b->n_descs != n_d || PyBytes_GET_SIZE(key) != key_len) {
    Py_DECREF(b);
    PyErr_SetString(PyExc_ValueError,
                    "fuselab launcher: the layout needs one char per argument of the key, and a meta per descriptor");
    return NULL;
  }
  b->function = (void*)(uintptr_t)function;
  b->block = 32 * num_warps;
  b->shared = shared;
  b->n_args = layout_len;
  memcpy(b->layout, layout, layout_len);
  int rc = PyDict_SetItem(self->binaries, key, (PyObject*)b);
  Py_DECREF(b);
  if (rc < 0) return NULL;
  Py_RETURN_NONE;
}

// refuse(key): launch answers None for `key` from now on (Triton launches it: a binary the launcher cannot pass).
static PyObject* Launcher_refuse(Launcher* self, PyObject* key) {
  if (!PyBytes_Check(key)) {
    PyErr_SetString(PyExc_TypeError, "refuse(key): key is the bytes launch() returned");
    return NULL;
  }
  if (PyDict_SetItem(self->binaries, key, Py_None) < 0) return NULL;
  Py_RETURN_NONE;
}

// size() -> the number of binaries registered (refused keys not counted).
static PyObject* Launcher_size(Launcher* self, PyObject* Py_UNUSED(ignored)) {
  Py_ssize_t pos = 0, n = 0;
  PyObject *key, *value;
  while (PyDict_Next(self->binaries, &pos, &key, &value)) n += value != Py_None;
  return PyLong_FromSsize_t(n);
}

// Launcher(dtypes, descriptor_type=None)
static int Launcher_init(Launcher* self, PyObject* args, PyObject* kwds) {
  PyObject* dtypes;
  PyObject* descriptor_type = Py_None;
  static char* names[] = {"dtypes", "descriptor_type", NULL};
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!|O", names, &PyDict_Type, &dtypes, &descriptor_type)) return -1;
  Py_INCREF(dtypes);
  Py_XSETREF(self->dtypes, dtypes);
  Py_INCREF(descriptor_type);
  Py_XSETREF(self->descriptor_type, descriptor_type);
  Py_XSETREF(self->binaries, PyDict_New());
  return self->binaries == NULL ? -1 : 0;
}

static void Launcher_dealloc(Launcher* self) {
  Py_XDECREF(self->dtypes);
  Py_XDECREF(self->descriptor_type);
  Py_XDECREF(self->binaries);
  Py_TYPE(self)->tp_free((PyObject*)self);
}

static PyMethodDef Launcher_methods[] = {
    {"launch", (PyCFunction)(void (*)(void))Launcher_launch, METH_FASTCALL,
     "launch(grid, device, stream, *args) -> True, the key (bytes: nothing registered for it), None"},
    {"key", (PyCFunction)(void (*)(void))Launcher_key, METH_FASTCALL, "key(device, *args) -> bytes or None"},
    {"add", (PyCFunction)Launcher_add, METH_VARARGS, "add(key, function, num_warps, shared, layout, descs=())"},
    {"binary", (PyCFunction)(void (*)(void))Launcher_binary, METH_FASTCALL, "binary(device, *args) -> Binary or None"},
    {"values", (PyCFunction)(void (*)(void))Launcher_values, METH_FASTCALL, "values(device, *args) -> bytes or None"},
    {"refuse", (PyCFunction)Launcher_refuse, METH_O, "refuse(key): Triton launches `key` from now on"},
    {"size", (PyCFunction)Launcher_size, METH_NOARGS, "number of binaries registered"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject LauncherType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "fuselab_launcher.Launcher",
    .tp_basicsize = sizeof(Launcher),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Launcher_init,
    .tp_dealloc = (destructor)Launcher_dealloc,
    .tp_methods = Launcher_methods,
    .tp_doc = "Launches one Triton kernel's binaries, one per key of its arguments (see the module's source).",
};

static PyTypeObject BinaryType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "fuselab_launcher.Binary",
    .tp_basicsize = sizeof(Binary),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One compiled binary of a Triton kernel.",
};

// ------------------------------------------------------------------------------------------------ replays
//
// A Replayer stands for one fused op's eager forward. Its key of a call reads each tensor's dtype, device, 16-byte
// alignment, shape and strides, and each option's value. A Recipe, recorded from the first call of a key (in
// Python: fuselab.ops.launcher.recipe), redoes such a call with no Python between: the outputs allocated (of the
// shapes, strides and dtypes the key's first call returned: the key fixes them all), then each step's binary
// launched with the values it was launched with, its pointers (and its descriptors' bases) patched to this call's
// inputs and outputs, on the current stream.

#define MAX_STEPS FUSELAB_RECIPE_MAX_STEPS
#define MAX_OUTPUTS FUSELAB_RECIPE_MAX_OUTPUTS
#define MAX_DIMS 8  // an output's rank
#define KEY_MAX 2048

typedef struct {
  Binary* binary;  // a reference held
  unsigned long long grid[3];
  uint64_t values[MAX_ARGS];
  DescArg descs[MAX_DESCS];
  Py_ssize_t n_patches;
  int patch_arg[MAX_ARGS];
  int patch_source[MAX_ARGS];  // -1 - j: output j; else the index of the call's argument whose address goes there
} Step;

typedef struct {
  int rank;
  int dtype;  // the dtype's number (Launcher's dtypes)
  int64_t sizes[MAX_DIMS];
  int64_t strides[MAX_DIMS];  // elements; the strides of a dense tensor (contiguous, or its dimensions permuted)
} OutputSpec;

typedef struct {
  PyObject_HEAD
  int device;
  void* context;  // the CUDA context the binaries were loaded in: replayed only while it is current
  void* stream;   // the stream its workspaces belong to (NULL: the default stream), replayed only on it if `bound`
  int bound;      // whether it holds workspaces (`keep` not empty): without, it runs on any stream
  PyObject* keep; // what the launches' constant pointers point into (workspaces), kept alive
  PyObject* options;  // the call's options (its arguments that are not tensors, in order): a tuple
  PyObject* shapes;   // the outputs' shapes, a tuple of tuples (the C Replayer allocates with them)
  PyObject* strides;  // the outputs' strides, a tuple of tuples
  int n_outputs;
  OutputSpec outputs[MAX_OUTPUTS];
  int n_steps;
  Step steps[MAX_STEPS];
} Recipe;

static PyTypeObject RecipeType;

// A tuple of `rank` ints from `values` (an output's sizes or strides): a new reference, NULL on an error.
static PyObject* int_tuple(const int64_t* values, int rank) {
  PyObject* t = PyTuple_New(rank);
  for (int d = 0; t != NULL && d < rank; d++) {
    PyObject* v = PyLong_FromLongLong(values[d]);
    if (v == NULL) Py_CLEAR(t);
    else PyTuple_SET_ITEM(t, d, v);
  }
  return t;
}

// The outputs of Recipe(...), ((sizes, dtype number[, strides]), ...), into r: 0, -1. Without strides, contiguous.
static int read_outputs(Recipe* r, PyObject* outputs) {
  PyObject* seq = PySequence_Fast(outputs, "outputs must be a sequence");
  if (seq == NULL) return -1;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  PyObject* shapes = PyTuple_New(n);
  PyObject* all_strides = PyTuple_New(n);
  int ok = shapes != NULL && all_strides != NULL && n >= 1 && n <= MAX_OUTPUTS;
  for (Py_ssize_t j = 0; ok && j < n; j++) {
    PyObject* sizes;
    PyObject* strides = NULL;
    OutputSpec* o = &r->outputs[j];
    ok = PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, j), "O!i|O!", &PyTuple_Type, &sizes, &o->dtype,
                          &PyTuple_Type, &strides);
    if (!ok) break;
    Py_ssize_t rank = PyTuple_GET_SIZE(sizes);
    ok = rank <= MAX_DIMS && (strides == NULL || PyTuple_GET_SIZE(strides) == rank);
    o->rank = (int)rank;
    for (Py_ssize_t d = 0; ok && d < rank; d++) {
      o->sizes[d] = PyLong_AsLongLong(PyTuple_GET_ITEM(sizes, d));
      ok = !(o->sizes[d] == -1 && PyErr_Occurred()) && o->sizes[d] >= 0;
    }
    for (Py_ssize_t d = rank - 1; ok && d >= 0; d--) {
      if (strides != NULL) o->strides[d] = PyLong_AsLongLong(PyTuple_GET_ITEM(strides, d));
      else o->strides[d] = d == rank - 1 ? 1 : o->strides[d + 1] * (o->sizes[d + 1] > 1 ? o->sizes[d + 1] : 1);
      ok = !(o->strides[d] == -1 && PyErr_Occurred()) && o->strides[d] >= 0;
    }
    PyObject* kept = ok ? int_tuple(o->strides, o->rank) : NULL;
    ok = kept != NULL;
    if (ok) {
      PyTuple_SET_ITEM(shapes, j, Py_NewRef(sizes));
      PyTuple_SET_ITEM(all_strides, j, kept);
    }
  }
  Py_DECREF(seq);
  if (!ok) {
    Py_XDECREF(shapes);
    Py_XDECREF(all_strides);
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "fuselab launcher: a recipe's outputs are not valid");
    return -1;
  }
  Py_XSETREF(r->shapes, shapes);
  Py_XSETREF(r->strides, all_strides);
  r->n_outputs = (int)n;
  return 0;
}

// Recipe(device, outputs, steps, keep=(), stream=0, options=()): outputs ((sizes, dtype number[, strides]), ...), each
// allocated with its strides (contiguous without); steps a sequence of (binary, (gx, gy, gz), values: bytes
// (Launcher.values), ((arg, source), ...)); keep: objects held for the recipe's life (the workspaces its values point
// into); stream: the only stream it may run on where it keeps any (0: the default stream); options: the recorded
// call's options (read by the C++ autograd, whose backward passes them on where Python runs it).
static int Recipe_init(Recipe* self, PyObject* args, PyObject* kwds) {
  int device;
  PyObject* outputs;
  PyObject* steps;
  PyObject* keep = NULL;
  PyObject* options = NULL;
  unsigned long long stream = 0;
  if (!PyArg_ParseTuple(args, "iOO|OKO!", &device, &outputs, &steps, &keep, &stream, &PyTuple_Type, &options))
    return -1;
  if (read_outputs(self, outputs) < 0) return -1;
  if (options == NULL) options = PyTuple_New(0);
  else Py_INCREF(options);
  if (options == NULL) return -1;
  Py_XSETREF(self->options, options);
  Py_XINCREF(keep);
  Py_XSETREF(self->keep, keep);
  self->stream = (void*)(uintptr_t)stream;
  // the default stream's handle is 0 too, so the stream alone cannot say "any" (a recipe recorded there with
  // workspaces was replayed on other streams, a CUDA graph's capture included, sharing its counters)
  self->bound = keep != NULL && PyObject_Length(keep) > 0;
  PyObject* seq = PySequence_Fast(steps, "steps must be a sequence");
  if (seq == NULL) return -1;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  if (n > MAX_STEPS) {
    Py_DECREF(seq);
    PyErr_Format(PyExc_ValueError, "fuselab launcher: a recipe holds at most %d launches", MAX_STEPS);
    return -1;
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject* binary;
    PyObject* values;
    PyObject* patches;
    Step* st = &self->steps[i];
    if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "O!(KKK)SO", &BinaryType, &binary, &st->grid[0],
                          &st->grid[1], &st->grid[2], &values, &patches)) {
      Py_DECREF(seq);
      return -1;
    }
    Binary* b = (Binary*)binary;
    Py_ssize_t n_values = b->n_args * (Py_ssize_t)sizeof(uint64_t);
    if (PyBytes_GET_SIZE(values) != n_values + b->n_descs * (Py_ssize_t)sizeof(DescArg)) {
      Py_DECREF(seq);
      PyErr_SetString(PyExc_ValueError,
                      "fuselab launcher: a step's values need 8 bytes per argument of its binary and its descriptors");
      return -1;
    }
    memcpy(st->values, PyBytes_AS_STRING(values), n_values);
    memcpy(st->descs, PyBytes_AS_STRING(values) + n_values, b->n_descs * sizeof(DescArg));
    PyObject* pseq = PySequence_Fast(patches, "patches must be a sequence");
    if (pseq == NULL) {
      Py_DECREF(seq);
      return -1;
    }
    st->n_patches = PySequence_Fast_GET_SIZE(pseq);
    for (Py_ssize_t j = 0; j < st->n_patches && j < MAX_ARGS; j++) {
      if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(pseq, j), "ii", &st->patch_arg[j], &st->patch_source[j]) ||
          st->patch_arg[j] < 0 || st->patch_arg[j] >= b->n_args || st->patch_source[j] < -self->n_outputs ||
          st->patch_source[j] >= MAX_ARGS) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "fuselab launcher: a patch past the arguments");
        Py_DECREF(pseq);
        Py_DECREF(seq);
        return -1;
      }
    }
    Py_DECREF(pseq);
    Py_INCREF(binary);
    st->binary = b;
    self->n_steps = (int)i + 1;
  }
  Py_DECREF(seq);
  self->device = device;
  if (load_driver() < 0 || cu_ctx_get_current(&self->context) != 0) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "fuselab launcher: no current CUDA context");
    return -1;
  }
  return 0;
}

static void Recipe_dealloc(Recipe* self) {
  for (int i = 0; i < self->n_steps; i++) Py_XDECREF(self->steps[i].binary);
  Py_XDECREF(self->keep);
  Py_XDECREF(self->options);
  Py_XDECREF(self->shapes);
  Py_XDECREF(self->strides);
  Py_TYPE(self)->tp_free((PyObject*)self);
}

static PyMemberDef Recipe_members[] = {
    {"options", T_OBJECT, offsetof(Recipe, options), READONLY, "the recorded call's options (a tuple)"},
    {"shapes", T_OBJECT, offsetof(Recipe, shapes), READONLY, "the outputs' shapes (a tuple of tuples)"},
    {"strides", T_OBJECT, offsetof(Recipe, strides), READONLY, "the outputs' strides (a tuple of tuples)"},
    {NULL, 0, 0, 0, NULL},
};

// Whether `r` may run now on `stream`: its CUDA context current, and if it holds workspaces, `stream` theirs and not
// capturing a CUDA graph (a graph's replays would share the eager calls' workspaces: the Python forward gives the
// capture buffers of its own).
static int recipe_ready(Recipe* r, void* stream) {
  void* context = NULL;
  if (cu_ctx_get_current == NULL || cu_ctx_get_current(&context) != 0 || context != r->context) return 0;
  if (!r->bound) return 1;
  int capture = 0;
  return stream == r->stream && cu_stream_is_capturing != NULL && cu_stream_is_capturing(stream, &capture) == 0 &&
         capture == 0;
}

// Run `r`'s launches on `stream`, pointers (a descriptor's base) patched to ptrs (by call argument) and out_ptrs (by
// output), with no Python: 0; -1 with a message in error.
static int run_steps(Recipe* r, const uint64_t* ptrs, const uint64_t* out_ptrs, void* stream, char* error,
                     size_t error_len) {
  for (int i = 0; i < r->n_steps; i++) {
    Step* st = &r->steps[i];
    uint64_t values[MAX_ARGS];
    DescArg descs[MAX_DESCS];
    memcpy(values, st->values, st->binary->n_args * sizeof(uint64_t));
    memcpy(descs, st->descs, st->binary->n_descs * sizeof(DescArg));
    for (Py_ssize_t j = 0; j < st->n_patches; j++) {
      int source = st->patch_source[j], arg = st->patch_arg[j];
      uint64_t address = source < 0 ? out_ptrs[-1 - source] : ptrs[source];
      if (st->binary->layout[arg] == PASS_DESC) descs[values[arg]].base = address;
      else values[arg] = address;
    }
    if (launch_raw(st->binary, st->grid, values, descs, stream, error, error_len) < 0) return -1;
  }
  return 0;
}

typedef struct {
  PyObject_HEAD
  PyObject* dtypes;        // dict: dtype -> int
  PyObject* by_number;     // dict: int -> dtype
  PyObject* recipes;       // dict: key -> Recipe
  PyObject* empty_strided;  // torch.empty_strided
  PyObject* raw_stream;    // torch._C._cuda_getCurrentRawStream
  PyObject* tensor_type;   // torch.Tensor: Replayer.call takes tensors of exactly this type
} Replayer;

typedef struct {
  unsigned char buf[KEY_MAX];
  Py_ssize_t len;
} KeyBuf;

static int put(KeyBuf* k, const void* p, Py_ssize_t n) {
  if (k->len + n > KEY_MAX) return 0;
  memcpy(k->buf + k->len, p, n);
  k->len += n;
  return 1;
}

static int put_ints(KeyBuf* k, PyObject* tuple) {  // a tuple of Python ints (torch.Size, a stride tuple)
  if (!PyTuple_Check(tuple)) return 0;
  Py_ssize_t n = PyTuple_GET_SIZE(tuple);
  if (!put(k, &n, sizeof n)) return 0;
  for (Py_ssize_t i = 0; i < n; i++) {
    long long v = PyLong_AsLongLong(PyTuple_GET_ITEM(tuple, i));
    if (v == -1 && PyErr_Occurred()) return -1;
    if (!put(k, &v, sizeof v)) return 0;
  }
  return 1;
}

// An option's value (None, bool, int, float, str) into k: 1; 0 when it makes no key (an int past 64 bits, a full
// buffer); 2 when `a` is not an option; -1 on a Python error.
static int put_option(KeyBuf* k, PyObject* a) {
  if (a == Py_None) return put(k, "n", 1);
  if (PyBool_Check(a)) return put(k, a == Py_True ? "t" : "f", 1);
  if (PyLong_Check(a)) {
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(a, &overflow);
    if (v == -1 && PyErr_Occurred()) return -1;
    return !overflow && put(k, "i", 1) && put(k, &v, sizeof v);
  }
  if (PyFloat_Check(a)) {
    double v = PyFloat_AS_DOUBLE(a);
    return put(k, "d", 1) && put(k, &v, sizeof v);
  }
  if (PyUnicode_Check(a)) {
    Py_ssize_t len;
    const char* text = PyUnicode_AsUTF8AndSize(a, &len);
    if (text == NULL) return -1;
    return put(k, "s", 1) && put(k, &len, sizeof len) && put(k, text, len);
  }
  return 2;
}

// A CUDA tensor into k (dtype, 16-byte alignment, device, shape, strides), its address into *ptr: 1, 0 (not a CUDA
// tensor of a numbered dtype, a full buffer), -1.
static int put_tensor(Replayer* self, KeyBuf* k, PyObject* a, uint64_t* ptr) {
  if (!on_gpu(a)) return 0;
  PyObject* dtype = PyObject_GetAttr(a, str_dtype);
  if (dtype == NULL) return -1;
  PyObject* code = PyDict_GetItemWithError(self->dtypes, dtype);  // borrowed
  Py_DECREF(dtype);
  if (code == NULL) return PyErr_Occurred() ? -1 : 0;
  PyObject* address = PyObject_CallMethodNoArgs(a, str_data_ptr);
  if (address == NULL) return -1;
  *ptr = PyLong_AsUnsignedLongLong(address);
  Py_DECREF(address);
  if (*ptr == (uint64_t)-1 && PyErr_Occurred()) return -1;
  PyObject* device = PyObject_CallMethodNoArgs(a, str_get_device);
  if (device == NULL) return -1;
  long dev = PyLong_AsLong(device);
  Py_DECREF(device);
  unsigned char head[3] = {'T', (unsigned char)PyLong_AsLong(code), (unsigned char)(*ptr % 16)};
  int ok = put(k, head, 3) && put(k, &dev, sizeof dev);
  if (ok) {
    PyObject* shape = PyObject_GetAttr(a, str_shape);
    if (shape == NULL) return -1;
    ok = put_ints(k, shape);
    Py_DECREF(shape);
  }
  if (ok > 0) {
    PyObject* strides = PyObject_CallMethodNoArgs(a, str_stride);
    if (strides == NULL) return -1;
    ok = put_ints(k, strides);
    Py_DECREF(strides);
  }
  return ok;
}

// The key of a call with positional `args` into k; each tensor's address into ptrs. With `plain`, as a user's call
// (Replayer.call): a tensor must be exactly torch.Tensor and not require grad. 1, 0 (an argument no key is made of),
// -1.
static int call_key(Replayer* self, PyObject* const* args, Py_ssize_t n, KeyBuf* k, uint64_t* ptrs, int plain) {
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject* a = args[i];
    int ok = put_option(k, a);
    if (ok == 2) {
      if (plain) {
        if (Py_TYPE(a) != (PyTypeObject*)self->tensor_type) return 0;
        PyObject* grad = PyObject_GetAttr(a, str_requires_grad);
        if (grad == NULL) return -1;
        Py_DECREF(grad);
        if (grad != Py_False) return 0;
      }
      ok = put_tensor(self, k, a, &ptrs[i]);
    }
    if (ok <= 0) return ok;
  }
  return 1;
}

// Options given by keyword (a dict of name -> None, bool, int, float or str) into k: 1, 0 (another value), -1.
static int keyword_key(PyObject* kwargs, KeyBuf* k) {
  Py_ssize_t pos = 0;
  PyObject *name, *value;
  while (PyDict_Next(kwargs, &pos, &name, &value)) {
    Py_ssize_t len;
    const char* text = PyUnicode_AsUTF8AndSize(name, &len);
    if (text == NULL) return -1;
    int ok = put(k, "k", 1) && put(k, &len, sizeof len) && put(k, text, len);
    if (ok) ok = put_option(k, value);
    if (ok != 1) return ok == 2 ? 0 : ok;
  }
  return 1;
}

static PyObject* replay_key(Replayer* self, PyObject* const* args, Py_ssize_t n, uint64_t* ptrs) {
  KeyBuf k;
  k.len = 0;
  if (n > MAX_ARGS) Py_RETURN_NONE;
  int ok = call_key(self, args, n, &k, ptrs, 0);
  if (ok < 0) return NULL;
  if (ok == 0) Py_RETURN_NONE;
  return PyBytes_FromStringAndSize((const char*)k.buf, k.len);
}

// key(*args) -> bytes, or None (an argument no key is made of: the call is not replayed).
static PyObject* Replayer_key(Replayer* self, PyObject* const* args, Py_ssize_t nargs) {
  uint64_t ptrs[MAX_ARGS];
  return replay_key(self, args, nargs, ptrs);
}

// Recipe `r` run for a call with positional `args` (ptrs: their tensors' addresses): its output; None when the
// recipe's CUDA context is not current, or its stream not the current one; NULL on an error.
static PyObject* run_recipe(Replayer* self, Recipe* r, PyObject* const* args, const uint64_t* ptrs) {
  if (load_driver() < 0) return NULL;
  PyObject* device = PyLong_FromLong(r->device);
  if (device == NULL) return NULL;
  PyObject* stream_obj = PyObject_CallOneArg(self->raw_stream, device);
  Py_DECREF(device);
  if (stream_obj == NULL) return NULL;
  void* stream = PyLong_AsVoidPtr(stream_obj);
  Py_DECREF(stream_obj);
  if (stream == NULL && PyErr_Occurred()) return NULL;
  if (!recipe_ready(r, stream)) Py_RETURN_NONE;  // another context, or its workspaces are another stream's
  PyObject* outs = PyTuple_New(r->n_outputs);
  if (outs == NULL) return NULL;
  uint64_t out_ptrs[MAX_OUTPUTS];
  for (int j = 0; j < r->n_outputs; j++) {
    PyObject* number = PyLong_FromLong(r->outputs[j].dtype);
    PyObject* dtype = number == NULL ? NULL : PyDict_GetItemWithError(self->by_number, number);  // borrowed
    Py_XDECREF(number);
    PyObject* kwargs = dtype == NULL ? NULL : Py_BuildValue("{s:O,s:i}", "dtype", dtype, "device", r->device);
    PyObject* shape = PyTuple_Pack(2, PyTuple_GET_ITEM(r->shapes, j), PyTuple_GET_ITEM(r->strides, j));
    PyObject* out = kwargs == NULL || shape == NULL ? NULL : PyObject_Call(self->empty_strided, shape, kwargs);
    Py_XDECREF(kwargs);
    Py_XDECREF(shape);
    PyObject* address = out == NULL ? NULL : PyObject_CallMethodNoArgs(out, str_data_ptr);
    if (address == NULL) {
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "fuselab launcher: a recipe's output dtype");
      Py_XDECREF(out);
      Py_DECREF(outs);
      return NULL;
    }
    PyTuple_SET_ITEM(outs, j, out);
    out_ptrs[j] = PyLong_AsUnsignedLongLong(address);
    Py_DECREF(address);
  }
  char error[256];
  if (run_steps(r, ptrs, out_ptrs, stream, error, sizeof error) < 0) {
    Py_DECREF(outs);
    PyErr_SetString(PyExc_RuntimeError, error);
    return NULL;
  }
  if (r->n_outputs > 1) return outs;
  PyObject* out = Py_NewRef(PyTuple_GET_ITEM(outs, 0));
  Py_DECREF(outs);
  return out;
}

// The recipe held for `key` (a new reference to bytes), run: the output; `key` itself when none is held (returned);
// None for a refused key or another context. Steals `key`.
static PyObject* replay_by_key(Replayer* self, PyObject* key, PyObject* const* args, const uint64_t* ptrs) {
  PyObject *found, *answer;
  int held = look_up(self->recipes, key, &found, &answer);  // refused: forward, every time
  if (held <= 0) return held < 0 ? NULL : answer;
  return run_recipe(self, (Recipe*)found, args, ptrs);
}

// replay(*args) -> the output; the call's key (bytes) when no recipe is held for it (Python runs forward, recording
// it, and adds a recipe or refuses the key); None when the call makes no key, its key was refused, or the recipe's
// CUDA context is not current (Python runs forward).
static PyObject* Replayer_replay(Replayer* self, PyObject* const* args, Py_ssize_t nargs) {
  uint64_t ptrs[MAX_ARGS];
  PyObject* key = replay_key(self, args, nargs, ptrs);
  if (key == NULL || key == Py_None) return key;
  return replay_by_key(self, key, args, ptrs);
}

// call(args, kwargs) -> as replay, for a call as a user makes it (the positional arguments as a tuple, the options
// given by keyword as a dict): tensors exactly torch.Tensor, none requiring grad, options by keyword of the kinds
// positional ones may be (their names are part of the key). None, besides replay's cases, when replays are off
// (`set_enabled`) or this thread is recording.
static PyObject* Replayer_call(Replayer* self, PyObject* const* argv, Py_ssize_t nargv) {
  if (nargv != 2 || !PyTuple_CheckExact(argv[0]) || !PyDict_CheckExact(argv[1])) {
    PyErr_SetString(PyExc_TypeError, "call(args: tuple, kwargs: dict)");
    return NULL;
  }
  if (!replays_on || recording_depth > 0) Py_RETURN_NONE;
  PyObject* const* args = &PyTuple_GET_ITEM(argv[0], 0);
  Py_ssize_t n = PyTuple_GET_SIZE(argv[0]);
  if (n > MAX_ARGS) Py_RETURN_NONE;
  uint64_t ptrs[MAX_ARGS];
  KeyBuf k;
  k.len = 0;
  int ok = call_key(self, args, n, &k, ptrs, 1);
  if (ok > 0 && PyDict_GET_SIZE(argv[1]) > 0) ok = keyword_key(argv[1], &k);
  if (ok < 0) return NULL;
  if (ok == 0) Py_RETURN_NONE;
  PyObject* key = PyBytes_FromStringAndSize((const char*)k.buf, k.len);
  if (key == NULL) return NULL;
  return replay_by_key(self, key, args, ptrs);
}

// add(key, recipe): replay calls of `key` (from `key`) by `recipe`.
static PyObject* Replayer_add(Replayer* self, PyObject* args) {
  PyObject* key;
  PyObject* recipe;
  if (!PyArg_ParseTuple(args, "SO!", &key, &RecipeType, &recipe)) return NULL;
  if (PyDict_Size(self->recipes) >= 4096) PyDict_Clear(self->recipes);  // a bound on the table, not an LRU
  if (PyDict_SetItem(self->recipes, key, recipe) < 0) return NULL;
  Py_RETURN_NONE;
}

// refuse(key): replay answers None for `key` from now on (a call no recipe can redo: forward runs, unrecorded).
static PyObject* Replayer_refuse(Replayer* self, PyObject* key) {
  if (!PyBytes_Check(key)) {
    PyErr_SetString(PyExc_TypeError, "refuse(key): key is the bytes replay() returned");
    return NULL;
  }
  if (PyDict_Size(self->recipes) >= 4096) PyDict_Clear(self->recipes);
  if (PyDict_SetItem(self->recipes, key, Py_None) < 0) return NULL;
  Py_RETURN_NONE;
}

// size() -> the number of recipes held (refused keys not counted).
static PyObject* Replayer_size(Replayer* self, PyObject* Py_UNUSED(ignored)) {
  Py_ssize_t pos = 0, n = 0;
  PyObject *key, *value;
  while (PyDict_Next(self->recipes, &pos, &key, &value)) n += value != Py_None;
  return PyLong_FromSsize_t(n);
}

// Replayer(dtypes, empty_strided, raw_stream, tensor_type)
static int Replayer_init(Replayer* self, PyObject* args, PyObject* kwds) {
  PyObject *dtypes, *empty_strided, *raw_stream, *tensor_type;
  if (!PyArg_ParseTuple(args, "O!OOO!", &PyDict_Type, &dtypes, &empty_strided, &raw_stream, &PyType_Type,
                        &tensor_type))
    return -1;
  PyObject* by_number = PyDict_New();
  if (by_number == NULL) return -1;
  Py_ssize_t pos = 0;
  PyObject *dtype, *number;
  while (PyDict_Next(dtypes, &pos, &dtype, &number)) {
    if (PyDict_SetItem(by_number, number, dtype) < 0) {
      Py_DECREF(by_number);
      return -1;
    }
  }
  Py_INCREF(dtypes);
  Py_INCREF(empty_strided);
  Py_INCREF(raw_stream);
  Py_INCREF(tensor_type);
  Py_XSETREF(self->tensor_type, tensor_type);
  Py_XSETREF(self->dtypes, dtypes);
  Py_XSETREF(self->by_number, by_number);
  Py_XSETREF(self->empty_strided, empty_strided);
  Py_XSETREF(self->raw_stream, raw_stream);
  Py_XSETREF(self->recipes, PyDict_New());
  return self->recipes == NULL ? -1 : 0;
}

static void Replayer_dealloc(Replayer* self) {
  Py_XDECREF(self->dtypes);
  Py_XDECREF(self->by_number);
  Py_XDECREF(self->recipes);
  Py_XDECREF(self->empty_strided);
  Py_XDECREF(self->raw_stream);
  Py_XDECREF(self->tensor_type);
  Py_TYPE(self)->tp_free((PyObject*)self);
}

static PyMethodDef Replayer_methods[] = {
    {"replay", (PyCFunction)(void (*)(void))Replayer_replay, METH_FASTCALL,
     "replay(*args) -> the output, the key (no recipe yet), or None (forward runs)"},
    {"call", (PyCFunction)(void (*)(void))Replayer_call, METH_FASTCALL,
     "call(args, kwargs) -> replay's answer for a user's call (None also when replays are off or recording)"},
    {"key", (PyCFunction)(void (*)(void))Replayer_key, METH_FASTCALL, "key(*args) -> bytes or None"},
    {"add", (PyCFunction)Replayer_add, METH_VARARGS, "add(key, recipe)"},
    {"refuse", (PyCFunction)Replayer_refuse, METH_O, "refuse(key): forward runs for `key` from now on"},
    {"size", (PyCFunction)Replayer_size, METH_NOARGS, "number of recipes"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ReplayerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "fuselab_launcher.Replayer",
    .tp_basicsize = sizeof(Replayer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Replayer_init,
    .tp_dealloc = (destructor)Replayer_dealloc,
    .tp_methods = Replayer_methods,
    .tp_doc = "Replays one fused op's eager calls from their recipes (see the module's source).",
};

static PyTypeObject RecipeType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "fuselab_launcher.Recipe",
    .tp_basicsize = sizeof(Recipe),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Recipe_init,
    .tp_dealloc = (destructor)Recipe_dealloc,
    .tp_members = Recipe_members,
    .tp_doc = "How to redo one key's call: the output's allocation and the launches.",
};

// set_enabled(on): whether Replayer.call replays (fuselab.ops.launcher.enabled keeps it in step).
static PyObject* set_enabled(PyObject* Py_UNUSED(m), PyObject* on) {
  int truth = PyObject_IsTrue(on);
  if (truth < 0) return NULL;
  replays_on = truth;
  Py_RETURN_NONE;
}

// recording(step): this thread enters (+1) or leaves (-1) a recording (fuselab.ops.launcher.recording).
static PyObject* recording(PyObject* Py_UNUSED(m), PyObject* step) {
  long v = PyLong_AsLong(step);
  if (v == -1 && PyErr_Occurred()) return NULL;
  recording_depth += (int)v;
  Py_RETURN_NONE;
}

// ------------------------------------------------------------------------------------------------ the C API

static int api_replays_on(void) { return replays_on; }
static int api_recording_depth(void) { return recording_depth; }
static int api_is_recipe(void* object) { return Py_IS_TYPE((PyObject*)object, &RecipeType); }
static int api_recipe_outputs(void* recipe) { return ((Recipe*)recipe)->n_outputs; }
static const int64_t* api_recipe_output(void* recipe, int j, int* rank, int* dtype, const int64_t** strides) {
  const OutputSpec* o = &((Recipe*)recipe)->outputs[j];
  *rank = o->rank;
  *dtype = o->dtype;
  *strides = o->strides;
  return o->sizes;
}
static int api_recipe_device(void* recipe) { return ((Recipe*)recipe)->device; }
static int api_recipe_ready(void* recipe, void* stream) { return recipe_ready((Recipe*)recipe, stream); }
static int api_run_recipe(void* recipe, const uint64_t* ptrs, const uint64_t* out_ptrs, void* stream, char* error,
                          size_t error_len) {
  return run_steps((Recipe*)recipe, ptrs, out_ptrs, stream, error, error_len);
}

static FuselabLauncherApi api = {
    FUSELAB_LAUNCHER_API_VERSION, api_replays_on,     api_recording_depth, api_is_recipe,  api_recipe_outputs,
    api_recipe_output,            api_recipe_device,  api_recipe_ready,    api_run_recipe,
};

static PyMethodDef module_methods[] = {
    {"set_enabled", set_enabled, METH_O, "set_enabled(on): whether Replayer.call replays"},
    {"recording", recording, METH_O, "recording(+1 or -1): this thread enters or leaves a recording"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "fuselab_launcher", NULL, -1, module_methods};

PyMODINIT_FUNC PyInit_fuselab_launcher(void) {
  if (PyType_Ready(&LauncherType) < 0 || PyType_Ready(&BinaryType) < 0 || PyType_Ready(&ReplayerType) < 0 ||
      PyType_Ready(&RecipeType) < 0)
    return NULL;
  str_data_ptr = PyUnicode_InternFromString("data_ptr");
  str_dtype = PyUnicode_InternFromString("dtype");
  str_is_cuda = PyUnicode_InternFromString("is_cuda");
  str_get_device = PyUnicode_InternFromString("get_device");
  str_shape = PyUnicode_InternFromString("shape");
  str_stride = PyUnicode_InternFromString("stride");
  str_requires_grad = PyUnicode_InternFromString("requires_grad");
  str_base = PyUnicode_InternFromString("base");
  str_block_shape = PyUnicode_InternFromString("block_shape");
  str_padding = PyUnicode_InternFromString("padding");
  str_strides = PyUnicode_InternFromString("strides");
  if (str_data_ptr == NULL || str_dtype == NULL || str_is_cuda == NULL || str_get_device == NULL ||
      str_shape == NULL || str_stride == NULL || str_requires_grad == NULL || str_base == NULL ||
      str_block_shape == NULL || str_padding == NULL || str_strides == NULL)
    return NULL;
  PyObject* m = PyModule_Create(&module);
  if (m == NULL) return NULL;
  PyObject* capsule = PyCapsule_New(&api, "fuselab_launcher.api", NULL);
  if (capsule == NULL || PyModule_AddObject(m, "api", capsule) < 0) {
    Py_XDECREF(capsule);
    Py_DECREF(m);
    return NULL;
  }
  if (PyModule_AddIntConstant(m, "MAX_STEPS", MAX_STEPS) < 0 ||
      PyModule_AddIntConstant(m, "MAX_OUTPUTS", MAX_OUTPUTS) < 0) {
    Py_DECREF(m);
    return NULL;
  }
  PyTypeObject* types[] = {&LauncherType, &ReplayerType, &RecipeType};
  const char* names[] = {"Launcher", "Replayer", "Recipe"};
  for (int i = 0; i < 3; i++) {
    Py_INCREF(types[i]);
    if (PyModule_AddObject(m, names[i], (PyObject*)types[i]) < 0) {
      Py_DECREF(types[i]);
      Py_DECREF(m);
      return NULL;
    }
  }
  return m;
}
