#include "gpu/engine/prefetch_engine.hpp"

#include <algorithm>
#include <deque>

#include "gpu/data/dataset.hpp"
#include "gpu/data/order.hpp"
#include "gpu/data/packer.hpp"
#include "gpu/data/staging.hpp"
#include "gpu/pch.hpp"
#include "gpu/transport/tensors.hpp"

namespace tandem::gpu {

struct prefetch_engine::impl {
  prefetch_engine_options opts;
  data::dataset ds;
  data::stager stager;
  std::optional<data::packer> epoch_packer;
  std::deque<int64_t> reissue_queue;
  int64_t real = 0, padding = 0;

  impl(const prefetch_engine_options& o)
    : opts(o),
      ds(o.dataset, data::dataset_options{o.verify_hashes}),
      stager(o.device < 0 ? at::Device(at::kCPU)
                          : at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(o.device))) {}

  data::packer_options packing() const {
    data::packer_options p;
    p.rows = opts.rows;
    p.seq_len = opts.seq_len;
    p.max_docs = opts.max_docs;
    p.lookahead = opts.lookahead;
    p.pinned = opts.device >= 0;
    return p;
  }

  staged_batch publish(const data::packed_batch& b) {
    auto d = stager.stage(b);
    transport::payload p;
    p.tensors = {d.tokens, d.loss_mask, d.doc_lengths};
#ifdef TANDEM_HAVE_CUDA
    p.ready = d.ready;
#endif
    staged_batch out;
    out.handle = transport::publish(std::move(p));
    out.sample_ids = b.sample_ids;
    out.rows = b.tokens.size(0);
    out.seq_len = b.tokens.size(1);
    out.real_tokens = b.real_tokens;
    out.padding_tokens = b.padding_tokens;
    real += b.real_tokens;
    padding += b.padding_tokens;
    return out;
  }
};

prefetch_engine::prefetch_engine(const prefetch_engine_options& opts)
  : impl_(std::make_unique<impl>(opts)) {}
prefetch_engine::~prefetch_engine() = default;
prefetch_engine::prefetch_engine(prefetch_engine&&) noexcept = default;
prefetch_engine& prefetch_engine::operator=(prefetch_engine&&) noexcept = default;

int64_t prefetch_engine::dataset_samples() const {
  return impl_->ds.num_samples();
}

void prefetch_engine::start_epoch(int64_t epoch, const std::unordered_set<int64_t>& done) {
  auto& m = *impl_;
  auto order = data::rank_order(data::epoch_order(m.ds.num_samples(), m.opts.seed, epoch),
                                m.opts.rank, m.opts.world);
  if (!done.empty())
    order.erase(std::remove_if(order.begin(), order.end(),
                               [&](int64_t s) { return done.count(s) > 0; }),
                order.end());
  data::cursor from;
  from.epoch = epoch;
  m.epoch_packer.emplace(m.ds, std::move(order), m.packing(), from);
}

void prefetch_engine::reissue(const std::vector<int64_t>& sample_ids) {
  impl_->reissue_queue.insert(impl_->reissue_queue.end(), sample_ids.begin(), sample_ids.end());
}

std::optional<staged_batch> prefetch_engine::next() {
  auto& m = *impl_;
  if (!m.reissue_queue.empty()) {
    // Re-issued samples first, packed on their own so a batch never mixes
    // them with samples the epoch order has not reached.
    std::vector<int64_t> ids(m.reissue_queue.begin(), m.reissue_queue.end());
    m.reissue_queue.clear();
    data::packer p(m.ds, ids, m.packing(), data::cursor{});
    std::vector<data::packed_batch> batches;
    while (auto b = p.next())
      batches.push_back(std::move(*b));
    if (!batches.empty()) {
      // Hand out the first; queue the rest's samples again (cheap to re-pack).
      for (size_t i = 1; i < batches.size(); ++i)
        m.reissue_queue.insert(m.reissue_queue.end(), batches[i].sample_ids.begin(),
                               batches[i].sample_ids.end());
      return m.publish(batches.front());
    }
  }
  if (!m.epoch_packer)
    return std::nullopt;
  auto b = m.epoch_packer->next();
  if (!b)
    return std::nullopt;
  return m.publish(*b);
}

void prefetch_engine::release(transport::handle h) {
  transport::release(h);
}

double prefetch_engine::padding_waste() const {
  const auto total = impl_->real + impl_->padding;
  return total == 0 ? 0.0 : static_cast<double>(impl_->padding) / static_cast<double>(total);
}

} // namespace tandem::gpu
