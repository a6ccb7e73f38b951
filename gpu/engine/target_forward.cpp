#include "gpu/engine/target_forward.hpp"

#include "gpu/device/env.hpp"
#include "gpu/device/error.hpp"
#include "gpu/engine/graph.hpp"

namespace tandem::gpu {

#ifdef TANDEM_HAVE_CUDA
/// One captured packed forward: its static inputs and output (the graph's pool).
struct target_forward_runner::graph {
  explicit graph(const at::Device& d) : step(d) {}
  captured_step step;
  at::Tensor ids;      ///< [B, S] int64
  at::Tensor lengths;  ///< [B, K] int64
  at::Tensor taps;     ///< [B, S, n·D]: overwritten by each replay
};
#else
struct target_forward_runner::graph {};
#endif

target_forward_runner::target_forward_runner(const qwen3_target& target, at::Device device,
                                             const std::string& asked)
  : target_(target), device_(device) {
  const auto mode = mode_choice(asked, "TANDEM_TARGET_PATH", {"graphs", "eager", "mask"});
  const auto packed = target.packed_path();
  mask_ = mode == "mask" || packed != "packed";
  graphs_ = mode == "graphs" && !mask_ && device.is_cuda();
  (void)device_turns_enabled();  // a bad TANDEM_SHARED_GPU fails here, not at the first batch
  path_ = mode == "mask" ? "mask (asked)" : graphs_ ? "packed (graphs)" : packed;
}

target_forward_runner::~target_forward_runner() = default;

int64_t target_forward_runner::graph_pool_bytes() const {
  int64_t n = 0;
#ifdef TANDEM_HAVE_CUDA
  for (const auto& [k, g] : graphs_by_shape_)
    n += g->step.pool_bytes();
#endif
  return n;
}

at::Tensor target_forward_runner::taps(const at::Tensor& ids, const at::Tensor& doc_lengths) {
  if (mask_)
    return target_.forward(ids, make_doc_layout(doc_lengths, ids.size(1))).taps;
#ifdef TANDEM_HAVE_CUDA
  if (graphs_) {
    auto& g = graphs_by_shape_[{ids.size(0), ids.size(1), doc_lengths.size(1)}];
    if (!g) {
      auto fresh = std::make_unique<graph>(device_);
      fresh->ids = at::empty_like(ids);
      fresh->lengths = at::empty_like(doc_lengths);
      g = std::move(fresh);
    }
    // The graph's stream runs after what the caller's stream queued (the
    // payload's arrival), and the caller's after the replay.
    auto current = at::cuda::getCurrentCUDAStream(device_.index());
    at::cuda::CUDAEvent before, after;
    before.record(current);
    before.block(g->step.stream());
    try {
      c10::cuda::CUDAStreamGuard on(g->step.stream());
      g->ids.copy_(ids, true);
      g->lengths.copy_(doc_lengths, true);
      if (!g->step.captured()) {
        (void)target_.forward_packed(g->ids, g->lengths);  // warm-up: cuBLAS workspaces, allocator blocks
        g->step.capture([&] { g->taps = target_.forward_packed(g->ids, g->lengths).taps; }, {});
      }
      g->step.replay(/*take_turn=*/true, "target");  // a drafter on this GPU runs before or after, not beside
      ++replays_;
      after.record(g->step.stream());
    } catch (...) {
      // The caller's stream still waits for the copies from its tensors, and
      // a graph that failed to capture is not kept (the next batch tries anew).
      after.record(g->step.stream());
      after.block(current);
      graphs_by_shape_.erase({ids.size(0), ids.size(1), doc_lengths.size(1)});
      throw;
    }
    after.block(current);
    return g->taps.clone();  // the next replay overwrites the graph's output
  }
#endif
  return target_.forward_packed(ids, doc_lengths).taps;
}

} // namespace tandem::gpu
