"""A stage whose CUDA kernel stores to an illegal address (0x10): PTX loaded through the driver
API with ctypes (no nvcc, no cupy). The process gets CUDA error 700 and exits 1; the driver
reports XID 31 (MMU fault) through NVML."""
import ctypes, sys

PTX = b"""
.version 7.0
.target sm_70
.address_size 64
.visible .entry bad(.param .u64 p)
{
  .reg .u64 %rd<2>;
  .reg .u32 %r<2>;
  ld.param.u64 %rd1, [p];
  mov.u32 %r1, 1;
  st.global.u32 [%rd1], %r1;
  ret;
}
"""

cuda = ctypes.CDLL("libcuda.so.1")


def check(what, status):
    if status != 0:
        name = ctypes.c_char_p()
        cuda.cuGetErrorName(status, ctypes.byref(name))
        print(f"{what}: CUDA error {status} ({name.value.decode() if name.value else '?'})", flush=True)
        return False
    return True


check("cuInit", cuda.cuInit(0)) or sys.exit(2)
dev = ctypes.c_int()
check("cuDeviceGet", cuda.cuDeviceGet(ctypes.byref(dev), 0)) or sys.exit(2)
ctx = ctypes.c_void_p()
check("cuDevicePrimaryCtxRetain", cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)) or sys.exit(2)
check("cuCtxSetCurrent", cuda.cuCtxSetCurrent(ctx)) or sys.exit(2)
module = ctypes.c_void_p()
check("cuModuleLoadData", cuda.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(PTX))) or sys.exit(2)
fn = ctypes.c_void_p()
check("cuModuleGetFunction", cuda.cuModuleGetFunction(ctypes.byref(fn), module, b"bad")) or sys.exit(2)
address = ctypes.c_uint64(0x10)
params = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.byref(address), ctypes.c_void_p))
check("cuLaunchKernel", cuda.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, None, params, None))
ok = check("cuCtxSynchronize", cuda.cuCtxSynchronize())
sys.exit(0 if ok else 1)
