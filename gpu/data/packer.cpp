#include "gpu/pch.hpp"

#include "gpu/data/packer.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "gpu/device/error.hpp"

namespace tandem::gpu::data {

namespace {

[[noreturn]] void bad(const std::string& what) {
  throw error(errc::bad_input, "packer: " + what);
}

} // namespace

double packed_batch::padding_waste() const {
  const int64_t all = real_tokens + padding_tokens;
  return all > 0 ? static_cast<double>(padding_tokens) / static_cast<double>(all) : 0.0;
}

double packing_stats::padding_waste() const {
  const int64_t all = real_tokens + padding_tokens;
  return all > 0 ? static_cast<double>(padding_tokens) / static_cast<double>(all) : 0.0;
}

packer::packer(dataset ds, std::vector<int64_t> order, const packer_options& opts, cursor from)
  : ds_(std::move(ds)), order_(std::move(order)), opts_(opts), cursor_(std::move(from)) {
  auto positive = [](const char* name, int64_t v) {
    if (v < 1)
      bad(std::string(name) + " = " + std::to_string(v) + ", must be at least 1");
  };
  positive("rows", opts_.rows);
  positive("seq_len", opts_.seq_len);
  positive("max_docs", opts_.max_docs);
  positive("lookahead", opts_.lookahead);
  const auto size = static_cast<int64_t>(order_.size());
  if (cursor_.position < 0 || cursor_.position > size)
    bad("cursor position " + std::to_string(cursor_.position) + " is outside the order [0, "
        + std::to_string(size) + "]");
  int64_t prev = cursor_.position;
  for (size_t i = 0; i < cursor_.taken.size(); ++i) {
    const int64_t p = cursor_.taken[i];
    if (p <= prev || p >= size)
      bad("cursor taken[" + std::to_string(i) + "] = " + std::to_string(p)
          + " must be ascending, above position " + std::to_string(cursor_.position)
          + " and below " + std::to_string(size));
    prev = p;
  }
  skip_ = cursor_.taken;
  next_pos_ = cursor_.position;
  window_.reserve(static_cast<size_t>(opts_.lookahead));
}

bool packer::pull() {
  const auto size = static_cast<int64_t>(order_.size());
  while (next_pos_ < size) {
    const int64_t p = next_pos_++;
    if (skip_next_ < skip_.size() && skip_[skip_next_] == p) {
      ++skip_next_;
      continue;
    }
    window_.push_back(p);
    return true;
  }
  return false;
}

cursor packer::cursor_now() const {
  cursor c;
  c.epoch = cursor_.epoch;
  c.position = window_.empty() ? next_pos_ : window_.front();
  // Positions in [position, next_pos_) that are not pending were consumed;
  // so were the starting cursor's `taken` ones we have not reached yet.
  size_t w = 0;
  for (int64_t p = c.position; p < next_pos_; ++p) {
    if (w < window_.size() && window_[w] == p) {
      ++w;
      continue;
    }
    c.taken.push_back(p);
  }
  for (size_t i = skip_next_; i < skip_.size(); ++i)
    c.taken.push_back(skip_[i]);
  // With nothing pending, `position` may sit on a consumed position.
  while (!c.taken.empty() && c.taken.front() == c.position) {
    c.taken.erase(c.taken.begin());
    ++c.position;
  }
  return c;
}

bool packer::place(std::vector<std::vector<doc>>& row_docs, int64_t& truncated_samples,
                   int64_t& truncated_tokens) {
  const int64_t rows = opts_.rows, seq = opts_.seq_len, max_docs = opts_.max_docs;
  while (static_cast<int64_t>(window_.size()) < opts_.lookahead && pull()) {
  }
  if (window_.empty())
    return false;
  row_docs.assign(static_cast<size_t>(rows), {});
  std::vector<int64_t> used(static_cast<size_t>(rows), 0);
  size_t i = 0;
  while (i < window_.size()) {
    const int64_t id = order_[static_cast<size_t>(window_[i])];
    const int64_t full = ds_.sample_length(id);
    const int64_t len = std::min(full, seq);
    int64_t row = -1;
    for (int64_t r = 0; r < rows; ++r) {
      if (used[r] + len <= seq && static_cast<int64_t>(row_docs[r].size()) < max_docs) {
        row = r;
        break;
      }
    }
    if (row < 0) {
      ++i;  // stays pending; rows only fill up, so it will not fit this batch later either
      continue;
    }
    row_docs[row].push_back({id, len});
    used[row] += len;
    if (len < full) {
      ++truncated_samples;
      truncated_tokens += full - len;
    }
    window_.erase(window_.begin() + static_cast<std::ptrdiff_t>(i));
    pull();
  }
  return true;
}

int64_t packer::count_rest() {
  std::vector<std::vector<doc>> row_docs;
  int64_t n = 0, truncated_samples = 0, truncated_tokens = 0;
  while (place(row_docs, truncated_samples, truncated_tokens))
    ++n;
  return n;
}

std::optional<packed_batch> packer::next() {
  const int64_t rows = opts_.rows, seq = opts_.seq_len, max_docs = opts_.max_docs;
  // Plan: lengths only.
  std::vector<std::vector<doc>> row_docs;
  packed_batch b;
  if (!place(row_docs, b.truncated_samples, b.truncated_tokens))
    return std::nullopt;

  // Fill: copy each document out of the mapping, zero the tails.
  auto opts = at::TensorOptions().device(at::kCPU);
  if (opts_.pinned && at::hasCUDA())
    opts = opts.pinned_memory(true);
  b.tokens = at::empty({rows, seq}, opts.dtype(at::kInt));
  b.loss_mask = at::empty({rows, seq}, opts.dtype(at::kByte));
  b.doc_lengths = at::zeros({rows, max_docs}, opts.dtype(at::kLong));
  b.doc_ids = at::full({rows, max_docs}, -1, opts.dtype(at::kLong));
  auto* tokens = b.tokens.mutable_data_ptr<int32_t>();
  auto* mask = b.loss_mask.mutable_data_ptr<uint8_t>();
  auto* lengths = b.doc_lengths.mutable_data_ptr<int64_t>();
  auto* ids = b.doc_ids.mutable_data_ptr<int64_t>();
  for (int64_t r = 0; r < rows; ++r) {
    int64_t at_col = 0;
    for (size_t k = 0; k < row_docs[r].size(); ++k) {
      const auto& d = row_docs[r][k];
      const auto v = ds_.sample(d.id);
      std::memcpy(tokens + r * seq + at_col, v.tokens, static_cast<size_t>(d.length) * 4);
      std::memcpy(mask + r * seq + at_col, v.loss_mask, static_cast<size_t>(d.length));
      lengths[r * max_docs + static_cast<int64_t>(k)] = d.length;
      ids[r * max_docs + static_cast<int64_t>(k)] = d.id;
      at_col += d.length;
      b.sample_ids.push_back(d.id);
    }
    std::memset(tokens + r * seq + at_col, 0, static_cast<size_t>(seq - at_col) * 4);
    std::memset(mask + r * seq + at_col, 0, static_cast<size_t>(seq - at_col));
    b.real_tokens += at_col;
  }
  b.padding_tokens = rows * seq - b.real_tokens;
  b.after = cursor_ = cursor_now();

  ++stats_.batches;
  stats_.samples += static_cast<int64_t>(b.sample_ids.size());
  stats_.real_tokens += b.real_tokens;
  stats_.padding_tokens += b.padding_tokens;
  stats_.truncated_samples += b.truncated_samples;
  stats_.truncated_tokens += b.truncated_tokens;
  return b;
}

packer make_epoch_packer(const dataset& ds, uint64_t seed, int64_t rank, int64_t world,
                         const packer_options& opts, cursor from) {
  auto order = rank_order(epoch_order(ds.num_samples(), seed, from.epoch), rank, world);
  return packer(ds, std::move(order), opts, std::move(from));
}

step_count count_steps(const dataset& ds, uint64_t seed, int64_t ranks, int64_t drafters,
                       const packer_options& opts, int64_t epochs, int64_t budget) {
  if (ranks < 1 || drafters < 1 || epochs < 0)
    throw error(errc::bad_input, "count_steps: ranks " + std::to_string(ranks) + ", drafters "
                                   + std::to_string(drafters) + ", epochs " + std::to_string(epochs));
  step_count out;
  int64_t visited = 0;
  for (int64_t e = 0; e < epochs; ++e) {
    if (e > 0 && visited >= budget)
      break;
    const auto order = epoch_order(ds.num_samples(), seed, e);
    int64_t batches = 0;
    for (int64_t r = 0; r < ranks; ++r) {
      packer p(ds, rank_order(order, r, ranks), opts, cursor{e, 0, {}});
      batches += p.count_rest();
    }
    // The coordinator deals an epoch's batches `drafters` a step, the
    // last step of an epoch with fewer (coordinator_group.cpp).
    out.steps += (batches + drafters - 1) / drafters;
    ++out.epochs_counted;
    visited += ds.num_samples();
  }
  if (out.epochs_counted > 0 && out.epochs_counted < epochs)
    out.steps = static_cast<int64_t>(std::llround(static_cast<double>(out.steps) * static_cast<double>(epochs)
                                                  / static_cast<double>(out.epochs_counted)));
  return out;
}

sample_tensors tensors_of(const dataset& ds, int64_t id) {
  const auto v = ds.sample(id);
  sample_tensors out;
  out.id = id;
  // The deleters hold a copy of the dataset: the mapping outlives the views.
  out.tokens = at::from_blob(const_cast<int32_t*>(v.tokens), {v.length}, [ds](void*) {},
                             at::TensorOptions().dtype(at::kInt));
  out.loss_mask = at::from_blob(const_cast<uint8_t*>(v.loss_mask), {v.length}, [ds](void*) {},
                                at::TensorOptions().dtype(at::kByte));
  return out;
}

} // namespace tandem::gpu::data
