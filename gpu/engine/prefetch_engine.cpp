#include "gpu/engine/prefetch_engine.hpp"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "gpu/data/dataset.hpp"
#include "gpu/data/identity.hpp"
#include "gpu/data/order.hpp"
#include "gpu/data/packer.hpp"
#include "gpu/data/staging.hpp"
#include "gpu/data/verify_once.hpp"
#include "gpu/device/error.hpp"
#include "gpu/io/model_tokens.hpp"
#include "gpu/pch.hpp"
#include "gpu/transport/tensors.hpp"

namespace tandem::gpu {

namespace {

using steady = std::chrono::steady_clock;

double seconds_since(steady::time_point t0) {
  return std::chrono::duration<double>(steady::now() - t0).count();
}

/// Verifies a data set's shards (data::dataset::verify_shard) on one
/// background thread, in the order they are first needed, so that a large
/// data set's hashing overlaps the target's loading and the training
/// instead of stalling the start.  Several prefetch engines in one process
/// (one per target) share the results (data::verify_shard_once): each
/// shard is read once.  Cost, measured on the 2-core development machine
/// (AMD EPYC, SHA extensions, page cache): 1.06 s per GB of one core, of
/// which the token and mask scan is 0.09 s (data_test.verify_cost_per_gb
/// prints it anywhere; docs/data.md "Verification").  Shared with nothing: the engine owns it,
/// and it touches only the read-only data set and its own state (under
/// its mutex).  The destructor waits for the shard being verified (at most
/// one shard's time, ~0.1-0.5 s for a 256 MiB shard) and joins.
class shard_verifier {
public:
  shard_verifier(data::dataset ds, data::shard_check check)
    : ds_(std::move(ds)), check_(std::move(check)), state_(ds_.num_shards(), pending) {
    for (size_t i = 0; i < state_.size(); ++i)
      queue_.push_back(i);
    thread_ = std::thread([this] { run(); });
  }

  ~shard_verifier() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    changed_.notify_all();
    thread_.join();
  }

  shard_verifier(const shard_verifier&) = delete;
  shard_verifier& operator=(const shard_verifier&) = delete;

  /// Verify the shards in `order` next, in that order.
  void prioritize(const std::vector<size_t>& order) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::deque<size_t> q;
    std::vector<bool> queued(state_.size(), false);
    for (auto i : order)
      if (i < state_.size() && state_[i] == pending && !queued[i]) {
        q.push_back(i);
        queued[i] = true;
      }
    for (auto i : queue_)
      if (!queued[i] && state_[i] == pending) {
        q.push_back(i);
        queued[i] = true;
      }
    queue_ = std::move(q);
  }

  /// Returns once every shard in `shards` is verified (moving the pending
  /// ones to the front); throws the first failure of any shard.
  void require(const std::vector<size_t>& shards) {
    std::unique_lock<std::mutex> lock(mutex_);
    throw_if_failed();
    bool all = true;
    for (auto i : shards)
      all &= state_[i] == verified;
    if (all)
      return;
    // Wanted now: to the front, in the order given.
    for (auto it = shards.rbegin(); it != shards.rend(); ++it)
      if (state_[*it] == pending) {
        queue_.erase(std::remove(queue_.begin(), queue_.end(), *it), queue_.end());
        queue_.push_front(*it);
      }
    changed_.notify_all();
    const auto t0 = steady::now();
    changed_.wait(lock, [&] {
      if (!failure_.empty())
        return true;
      for (auto i : shards)
        if (state_[i] != verified)
          return false;
      return true;
    });
    stats_.waited_s += seconds_since(t0);
    throw_if_failed();
  }

  /// Throws the first failure so far, if any (never blocks for long).
  void check() {
    std::lock_guard<std::mutex> lock(mutex_);
    throw_if_failed();
  }

  verify_stats stats() const {
    std::lock_guard<std::mutex> lock(mutex_);
    auto s = stats_;
    s.shards = static_cast<int64_t>(state_.size());
    return s;
  }

private:
  enum state_t : uint8_t { pending, running, verified, failed };

  void throw_if_failed() const {
    if (!failure_.empty())
      throw error(errc::bad_input, failure_);
  }

  void run() {
    for (;;) {
      size_t index = 0;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        changed_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (stop_)
          return;
        index = queue_.front();
        queue_.pop_front();
        if (state_[index] != pending)
          continue;
        state_[index] = running;
      }
      const auto t0 = steady::now();
      std::string why;
      int64_t bytes = 0;
      try {
        data::verify_shard_once(ds_, index, check_);  // once per process, for all prefetches
        std::error_code ec;
        bytes = static_cast<int64_t>(std::filesystem::file_size(ds_.shard_path(index), ec));
      } catch (const std::exception& e) {
        why = e.what();
      }
      {
        std::lock_guard<std::mutex> lock(mutex_);
        stats_.seconds += seconds_since(t0);
        if (why.empty()) {
          state_[index] = verified;
          ++stats_.verified;
          stats_.bytes += bytes;
        } else {
          state_[index] = failed;
          failure_ = why;  // the first; the run stops on it, so no more are verified
          stop_ = true;
        }
      }
      changed_.notify_all();
    }
  }

  const data::dataset ds_;
  const data::shard_check check_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<state_t> state_;  ///< per shard
  std::deque<size_t> queue_;    ///< pending shards, next first
  std::string failure_;         ///< the first failure's message
  verify_stats stats_;
  bool stop_ = false;
  std::thread thread_;          ///< last: started once the rest exists
};

} // namespace

struct prefetch_engine::impl {
  prefetch_engine_options opts;
  data::dataset ds;
  data::stager stager;
  std::optional<data::packer> epoch_packer;
  std::deque<int64_t> reissue_queue;
  int64_t epoch_samples = 0;
  int64_t real = 0, padding = 0;
  std::vector<std::string> warnings;
  data::shard_check check;
  verify_stats sync_stats;                 ///< verify_hashes: done at construction
  std::unique_ptr<shard_verifier> verifier;  ///< last: its thread reads `ds`

  impl(const prefetch_engine_options& o)
    : opts(o),
      ds(o.dataset, data::dataset_options{/*verify_hashes=*/false, /*check_values=*/false}),
      stager(o.device < 0 ? at::Device(at::kCPU)
                          : at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(o.device))) {
    if (!o.target.empty()) {
      // The data set must belong to the target (gpu/data/identity.hpp).
      const auto target = load_model_tokens(o.target);
      warnings = data::check_tokenizer_identity(ds.manifest(), ds.dir() / "manifest.json", target);
      check.vocab_size = target.vocab_size;
      check.vocab_source = "vocab_size of " + target.file.string();
    }
    if (o.mask_token_id >= 0) {
      check.forbidden_token = o.mask_token_id;
      check.forbidden_source = "drafter.mask_token_id";
    }
    for (size_t i = 0; i < ds.num_shards(); ++i)
      if (ds.manifest().shards[i].sha256.empty()) {
        warnings.push_back((ds.dir() / "manifest.json").string() + ": shards["
                           + std::to_string(i) + "].sha256 is empty: the bytes of "
                           + ds.shard_path(i).string()
                           + " cannot be checked for changes (only its values are)");
        break;  // one is enough: such manifests are hand-written, all alike
      }
    if (o.verify_hashes) {
      // Everything now, before the first batch.
      const auto t0 = steady::now();
      for (size_t i = 0; i < ds.num_shards(); ++i)
        ds.verify_shard(i, check);
      sync_stats.shards = sync_stats.verified = static_cast<int64_t>(ds.num_shards());
      sync_stats.seconds = seconds_since(t0);
    } else if (o.verify_shards) {
      verifier = std::make_unique<shard_verifier>(ds, check);
    }
  }

  /// The shards `ids` come from, in the order they first appear.
  std::vector<size_t> shards_of(const std::vector<int64_t>& ids, size_t stop_after = SIZE_MAX) const {
    std::vector<size_t> out;
    std::vector<bool> seen(ds.num_shards(), false);
    for (auto id : ids) {
      const auto shard = ds.locate(id).first;
      if (!seen[shard]) {
        seen[shard] = true;
        out.push_back(shard);
        if (out.size() >= stop_after)
          break;
      }
    }
    return out;
  }

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
    // No token of an unverified shard reaches the device, nor of one
    // written in place since (the batch was read through its mapping).
    const auto shards = shards_of(b.sample_ids);
    for (auto s : shards)
      ds.check_unchanged(s);
    if (verifier)
      verifier->require(shards);
    auto d = stager.stage(b);
    transport::payload p;
    p.tensors = {d.tokens, d.loss_mask, d.doc_lengths};
#ifdef TANDEM_HAVE_CUDA
    p.ready = d.ready;
#endif
    staged_batch out;
    out.handle = transport::publish(std::move(p), transport::scope::host);
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
  // Verify the shards in the order this epoch first reads them.
  if (m.verifier)
    m.verifier->prioritize(m.shards_of(order, m.ds.num_shards()));
  m.epoch_samples = static_cast<int64_t>(order.size());
  data::cursor from;
  from.epoch = epoch;
  m.epoch_packer.emplace(m.ds, std::move(order), m.packing(), from);
  m.reissue_queue.clear();
}

void prefetch_engine::reissue(const std::vector<int64_t>& sample_ids) {
  impl_->reissue_queue.insert(impl_->reissue_queue.end(), sample_ids.begin(), sample_ids.end());
}

std::optional<staged_batch> prefetch_engine::next() {
  auto& m = *impl_;
  // A shard that failed verification stops the run at the next batch,
  // whichever shards that batch reads.
  if (m.verifier)
    m.verifier->check();
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

int64_t prefetch_engine::epoch_samples() const {
  return impl_->epoch_samples;
}

double prefetch_engine::padding_waste() const {
  const auto total = impl_->real + impl_->padding;
  return total == 0 ? 0.0 : static_cast<double>(impl_->padding) / static_cast<double>(total);
}

const std::vector<std::string>& prefetch_engine::warnings() const {
  return impl_->warnings;
}

verify_stats prefetch_engine::verification() const {
  return impl_->verifier ? impl_->verifier->stats() : impl_->sync_stats;
}

} // namespace tandem::gpu
