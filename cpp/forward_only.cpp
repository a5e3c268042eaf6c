// The Autograd kernel of fa2::kvcache_fwd, the forward-only KV-cache op: an error where grad mode is on and an input
// requires grad (flash-attn's flash_attn_with_kvcache returns outputs that silently carry no gradient), else the
// kernels below autograd. In C++ rather than beside the op's fake kernel in Python (fa2/kvcache.py): it runs once per
// layer in every decode step, where eager generation is host-bound, and the Python kernel cost about 8 us of host
// time a call (docs/tuning.md).
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/grad_mode.h>
#include <torch/library.h>

namespace fa2 {
namespace {

void kvcache_fwd_autograd(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  if (at::GradMode::is_enabled()) {
    const size_t num_args = op.schema().arguments().size();
    for (const c10::IValue& arg : torch::jit::last(*stack, num_args)) {
      TORCH_CHECK(!(arg.isTensor() && arg.toTensor().requires_grad()),
                  "fa2.attention_with_kvcache is forward only (inference): it has no gradient. Call it under "
                  "torch.no_grad() / torch.inference_mode(), or pass tensors that do not require grad (.detach()); "
                  "for training use fa2.attention or fa2.varlen_attention");
    }
  }
  const at::AutoDispatchBelowAutograd below_autograd;
  op.redispatchBoxed(keys & c10::after_autograd_keyset, stack);
}

}  // namespace
}  // namespace fa2

TORCH_LIBRARY_IMPL(fa2, Autograd, m) {
  m.impl("kvcache_fwd", torch::CppFunction::makeFromBoxedFunction<&fa2::kvcache_fwd_autograd>());
}
