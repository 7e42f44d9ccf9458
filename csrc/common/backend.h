// Front ends and backends (the ATen stub pattern).
//
// Each op family has one front end (csrc/ops/<family>.cpp): it checks the arguments, allocates
// the outputs, brings the inputs to the compute dtype and a contiguous layout, and then calls a
// KernelStub with a plain argument struct of sizes and pointers. The backends
// (csrc/kernels/cpu/, csrc/kernels/cuda/) only fill stub slots: they never see an unchecked
// tensor, never allocate an output and never register with the dispatcher. The Meta kernels
// share the front end's checks and allocation, so fake and real agree by construction.
//
// The front end registers itself for the CPU key, and for the CUDA key in a CUDA build
// (TE_REGISTER_FRONT_ENDS): a dispatch-key kernel exists exactly where a backend does.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/DeviceGuard.h>
#include <c10/macros/Macros.h>

#include <optional>
#include <utility>

#include "common/common.h"
#include "common/stub_registry.h"

namespace te_cpp {

template <typename Fn>
class KernelStub;

// One kernel pointer per backend device. Constant-initialised (constexpr constructor), so the
// backends' static registrations can fill it whatever the translation units' init order.
template <typename Ret, typename... Args>
class KernelStub<Ret(Args...)> {
 public:
  using Fn = Ret (*)(Args...);

  explicit constexpr KernelStub(const char* op) : op_(op) {}

  // Runs the kernel of `device`; a device without one is a clear error naming the op.
  template <typename... A>
  Ret operator()(c10::DeviceType device, A&&... args) const {
    const Fn fn = device == c10::DeviceType::CPU ? cpu_ : device == c10::DeviceType::CUDA ? cuda_
                                                                                          : nullptr;
    TE_CHECK(fn != nullptr, op_, "has no ", c10::DeviceTypeName(device),
             " kernel in this build");
    return fn(std::forward<A>(args)...);
  }

  bool has(c10::DeviceType device) const {
    return (device == c10::DeviceType::CPU ? cpu_ : cuda_) != nullptr;
  }
  const char* name() const { return op_; }

  // Called once per backend at static initialisation (TE_REGISTER_KERNEL).
  bool set(c10::DeviceType device, Fn fn) {
    (device == c10::DeviceType::CPU ? cpu_ : cuda_) = fn;
    return true;
  }

 private:
  const char* op_;
  Fn cpu_ = nullptr;
  Fn cuda_ = nullptr;
};

// In a family header: TE_DECLARE_STUB(bias_add_stub, void(const BiasAddArgs&));
// in its front end:   TE_DEFINE_STUB(bias_add_stub, void(const BiasAddArgs&));
// in a backend:       TE_REGISTER_KERNEL(bias_add_stub, CPU, bias_add_cpu);
#define TE_DECLARE_STUB(stub, ...) extern ::te_cpp::KernelStub<__VA_ARGS__> stub
#define TE_DEFINE_STUB(stub, ...)                                                          \
  ::te_cpp::KernelStub<__VA_ARGS__> stub(#stub);                                           \
  [[maybe_unused]] static const bool C10_ANONYMOUS_VARIABLE(te_stub_listed_) =             \
      ::te_cpp::register_stub(::te_cpp::StubEntry{                                         \
          #stub,                                                                           \
          [](const void* s) {                                                              \
            return static_cast<const decltype(stub)*>(s)->has(c10::DeviceType::CPU);       \
          },                                                                               \
          [](const void* s) {                                                              \
            return static_cast<const decltype(stub)*>(s)->has(c10::DeviceType::CUDA);      \
          },                                                                               \
          &stub})
#define TE_REGISTER_KERNEL(stub, device, fn)                  \
  [[maybe_unused]] static const bool C10_ANONYMOUS_VARIABLE(te_kernel_registered_) = \
      (stub).set(c10::DeviceType::device, (fn))

// The front ends are the dispatcher's CPU and (in a CUDA build) CUDA kernels:
//   static void register_family(torch::Library& m) { m.impl("bias_fwd", bias_fwd); ... }
//   TE_REGISTER_FRONT_ENDS(register_family)
#ifdef TECPP_WITH_CUDA
#define TE_REGISTER_FRONT_ENDS(fn)                      \
  TORCH_LIBRARY_IMPL(te_cpp, CPU, m) { fn(m); }         \
  TORCH_LIBRARY_IMPL(te_cpp, CUDA, m) { fn(m); }
#else
#define TE_REGISTER_FRONT_ENDS(fn) \
  TORCH_LIBRARY_IMPL(te_cpp, CPU, m) { fn(m); }
#endif

// Makes `t`'s device current for the front end's allocations and the backend's launch (a no-op
// for CPU tensors).
inline c10::OptionalDeviceGuard device_guard(const Tensor& t) {
  return c10::OptionalDeviceGuard(t.is_cpu() ? std::optional<c10::Device>() : t.device());
}

}  // namespace te_cpp
