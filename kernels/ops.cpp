// The compute interface's factory — the one place that chooses an implementation by backend — and the
// reads that bring results back to the host.
#include "kernels/ops.h"

#include <cstring>

#include "core/error.h"

namespace strata::kernels {

std::unique_ptr<Ops> make_ops(Device& dev, Stream& stream) {
  switch (dev.caps().backend) {
    case BackendKind::host:
      return make_cpu_ops(dev, stream);
    case BackendKind::cuda:
#ifdef STRATA_WITH_CUDA
      return make_cuda_ops(dev, stream);
#else
      break;
#endif
  }
  throw BackendError(detail::cat("the ", to_string(dev.caps().backend),
                                 " backend's compute ops are not built into this binary; rebuild with the "
                                 "CUDA toolkit (scripts/build.sh finds nvcc) or use --backend host"));
}

void Ops::read(void* host, const void* device, std::size_t bytes) {
  stream_.copy_async(host, device, bytes, CopyKind::device_to_host);
  stream_.synchronize();
}

float Ops::read_f32(Tensor x) {
  STRATA_CHECK(x.dtype == DType::fp32 && x.numel >= 1 && x.data, "kernels: read_f32 of a ",
               dtype_name(x.dtype), " tensor of ", x.numel);
  float v = 0;
  read(&v, x.data, sizeof v);
  return v;
}

double Ops::read_f64(Tensor x) {
  STRATA_CHECK(x.dtype == DType::u8 && x.numel >= sizeof(double) && x.data,
               "kernels: read_f64 needs the 8-byte u8 tensor squared_norm writes");
  double v = 0;
  read(&v, x.data, sizeof v);
  return v;
}

std::int32_t Ops::read_i32(Tensor x) {
  STRATA_CHECK(x.dtype == DType::i32 && x.numel >= 1 && x.data, "kernels: read_i32 of a ",
               dtype_name(x.dtype), " tensor of ", x.numel);
  std::int32_t v = 0;
  read(&v, x.data, sizeof v);
  return v;
}

}  // namespace strata::kernels
