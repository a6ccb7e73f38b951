#include "gpu/decode/speculative.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>

#include "gpu/device/env.hpp"
#include "gpu/device/error.hpp"

namespace tandem::gpu {

namespace {

double now_s(const at::Device& device) {
#ifdef TANDEM_HAVE_CUDA
  if (device.is_cuda())
    c10::cuda::getCurrentCUDAStream(device.index()).synchronize();
#else
  (void)device;
#endif
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::vector<int64_t> to_host(const at::Tensor& t) {
  auto c = t.to(at::kCPU, at::kLong).contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

/// One token from probabilities [V].
int64_t draw(const at::Tensor& probs, at::Generator& gen) {
  return at::multinomial(probs, 1, false, gen).item<int64_t>();
}

/// The target's token at each of logits [T, V]: argmax, or sampled.
struct verdict {
  int64_t accepted = 0;
  int64_t bonus = 0;
};

/// Greedy: the run of drafts equal to the target's argmax one position
/// earlier, then the target's own token after it.
verdict greedy_verdict(const at::Tensor& target_logits, const std::vector<int64_t>& drafts,
                       bool always_accept) {
  const auto posterior = to_host(target_logits.argmax(-1));  // [T]
  int64_t acc = 0;
  while (acc < static_cast<int64_t>(drafts.size()) && (always_accept || drafts[acc] == posterior[acc]))
    ++acc;
  return {acc, posterior[acc]};
}

/// Rejection sampling (the dflash package's _rejection_sample): draft k is
/// kept while u·q < p; the first rejected position samples the normalised
/// residual (p − q)+; all kept: the bonus samples the target's last position.
verdict sampled_verdict(const at::Tensor& target_probs, const at::Tensor& draft_probs,
                        const std::vector<int64_t>& drafts, bool always_accept,
                        at::Generator& gen) {
  const auto gamma = static_cast<int64_t>(drafts.size());
  if (gamma == 0)
    return {0, draw(target_probs[0], gen)};
  auto idx = at::tensor(drafts, at::TensorOptions().dtype(at::kLong)).to(target_probs.device()).unsqueeze(1);
  auto p = target_probs.narrow(0, 0, gamma).gather(1, idx).squeeze(1);
  auto q = draft_probs.gather(1, idx).squeeze(1);
  auto u = at::rand({gamma}, gen, q.options());
  auto keep = (u * q < p).to(at::kInt).cumprod(0).sum();
  const int64_t acc = always_accept ? gamma : keep.item<int64_t>();
  if (acc == gamma)
    return {acc, draw(target_probs[gamma], gen)};
  auto residual = (target_probs[acc] - draft_probs[acc]).clamp_min(0);
  auto total = residual.sum();
  if (total.item<double>() > 0)
    residual = residual / total;
  else
    residual = target_probs[acc];
  return {acc, draw(residual, gen)};
}

/// Prompt lookup: up to `count` tokens that followed the latest earlier
/// occurrence of the longest suffix of `seq` (at most `ngram` tokens long).
std::vector<int64_t> lookup(const std::vector<int64_t>& seq, int64_t ngram, int64_t count) {
  const auto n = static_cast<int64_t>(seq.size());
  for (int64_t len = std::min(ngram, n - 1); len >= 1; --len) {
    for (int64_t at = n - len - 1; at >= 0; --at) {  // latest occurrence first
      if (!std::equal(seq.begin() + at, seq.begin() + at + len, seq.end() - len))
        continue;
      const auto from = at + len;
      const auto k = std::min(count, n - from);
      if (k > 0)
        return {seq.begin() + from, seq.begin() + from + k};
    }
  }
  return {};
}

} // namespace

planted_bug planted_bug_from_env() {
  const auto s = env_choice("TANDEM_TEST_PLANT", {"none", "always_accept", "shifted_drafts"});
  return s == "always_accept"    ? planted_bug::always_accept
         : s == "shifted_drafts" ? planted_bug::shifted_drafts
                                 : planted_bug::none;
}

at::Tensor sampling_probs(const at::Tensor& logits, const sampling_options& s) {
  auto scores = logits.to(at::kFloat) / s.temperature;
  const auto vocab = scores.size(-1);
  at::Tensor indices;
  if (s.top_k > 0 && s.top_k < vocab)
    std::tie(scores, indices) = at::topk(scores, s.top_k, -1);
  auto probs = at::softmax(scores, -1);
  if (s.top_p < 1.0) {
    auto [sorted, order] = probs.sort(-1, /*descending=*/true);
    auto keep = (sorted.cumsum(-1) - sorted) < s.top_p;
    sorted = sorted * keep;
    probs = at::zeros_like(probs).scatter(-1, order, sorted);
    probs = probs / probs.sum(-1, /*keepdim=*/true);
  }
  if (indices.defined())
    probs = at::zeros_like(logits, probs.options()).scatter(-1, indices, probs);
  return probs;
}

generation speculative_generate(target_decoder& target, drafter_decoder* drafter,
                                const std::vector<int64_t>& prompt,
                                const speculative_options& o, at::Generator& gen) {
  const auto device = target.target().embedding().device();
  const auto n = static_cast<int64_t>(prompt.size());
  const auto max_length = n + o.max_new_tokens;
  const auto bs = o.block_size;
  const bool greedy = o.sampling.temperature <= 0;
  if (n == 0 || o.max_new_tokens < 1)
    throw error(errc::bad_input, "speculative decoding: an empty prompt or max_new_tokens < 1");
  const bool by_lookup = drafter == nullptr && o.lookup_ngram > 0;
  if (bs < 1 || (bs > 1 && drafter == nullptr && !by_lookup))
    throw error(errc::bad_input, "speculative decoding: block size " + std::to_string(bs)
                                   + " needs a drafter");
  if (max_length > target.capacity())
    throw error(errc::bad_input, "speculative decoding: prompt of " + std::to_string(n) + " + "
                                   + std::to_string(o.max_new_tokens) + " new tokens exceed the "
                                   + std::to_string(target.capacity()) + "-position cache");
  auto is_stop = [&](int64_t tok) {
    return std::find(o.stop_ids.begin(), o.stop_ids.end(), tok) != o.stop_ids.end();
  };
  const auto ids_opts = at::TensorOptions().dtype(at::kLong);
  target.reset();
  if (drafter)
    drafter->reset();

  generation g;
  auto t0 = now_s(device);
  const bool taps = bs > 1 && drafter != nullptr;
  std::vector<int64_t> seq;  // prompt + committed tokens (prompt lookup's haystack)
  if (by_lookup)
    seq = prompt;
  auto pre = target.forward(at::tensor(prompt, ids_opts).to(device).unsqueeze(0), taps,
                            at::full({1}, n - 1, ids_opts.device(device)));
  const auto first = greedy ? pre.logits[0][0].argmax().item<int64_t>()
                            : draw(sampling_probs(pre.logits[0][0], o.sampling), gen);
  target.set_length(0, n);
  if (taps)
    drafter->extend_context(pre.taps, {n});
  g.tokens.push_back(first);
  if (by_lookup)
    seq.push_back(first);
  auto t1 = now_s(device);
  g.prefill_s = t1 - t0;

  int64_t start = n;  // position of the last committed token (not yet in the caches)
  bool stopped = is_stop(first);
  const int64_t mask = drafter ? drafter->config().mask_token_id : 0;
  while (start + 1 < max_length && !stopped) {
    auto t = std::min(bs, max_length - start);
    std::vector<int64_t> proposed;
    if (by_lookup) {
      proposed = lookup(seq, o.lookup_ngram, t - 1);
      t = 1 + static_cast<int64_t>(proposed.size());
    }
    std::vector<int64_t> block(t, mask);
    block[0] = g.tokens.back();
    std::vector<int64_t> drafts;
    at::Tensor draft_probs;
    if (by_lookup && t > 1) {
      // A deterministic proposal: q is one-hot, so rejection sampling keeps
      // draft k with probability p(draft k) and resamples from p without it.
      drafts = proposed;
      if (!greedy)
        draft_probs = at::zeros({t - 1, target.target().config().vocab_size},
                                at::TensorOptions().dtype(at::kFloat).device(device))
                        .scatter_(1, at::tensor(drafts, ids_opts).to(device).unsqueeze(1), 1.0);
      std::copy(drafts.begin(), drafts.end(), block.begin() + 1);
    } else if (t > 1) {
      auto logits = drafter->draft(at::tensor(block, ids_opts).to(device).unsqueeze(0),
                                   o.bug == planted_bug::shifted_drafts)[0];  // [t-1, V]
      if (greedy) {
        drafts = to_host(logits.argmax(-1));
      } else {
        draft_probs = sampling_probs(logits, o.sampling);
        drafts = to_host(at::multinomial(draft_probs, 1, false, gen).squeeze(1));
      }
      std::copy(drafts.begin(), drafts.end(), block.begin() + 1);
    }
    auto out = target.forward(at::tensor(block, ids_opts).to(device).unsqueeze(0), taps && t > 1);
    const bool always = o.bug == planted_bug::always_accept;
    const auto v = greedy ? greedy_verdict(out.logits[0], drafts, always)
                          : sampled_verdict(sampling_probs(out.logits[0], o.sampling), draft_probs,
                                            drafts, always, gen);
    std::vector<int64_t> fresh(drafts.begin(), drafts.begin() + v.accepted);
    fresh.push_back(v.bonus);
    auto produced = std::min<int64_t>(v.accepted + 1, max_length - start - 1);
    for (int64_t i = 0; i < produced; ++i)
      if (is_stop(fresh[i])) {
        produced = i + 1;
        stopped = true;
        break;
      }
    g.tokens.insert(g.tokens.end(), fresh.begin(), fresh.begin() + produced);
    if (by_lookup)
      seq.insert(seq.end(), fresh.begin(), fresh.begin() + produced);
    g.produced.push_back(produced);
    start += produced;
    target.set_length(0, start);
    if (taps && t > 1)
      drafter->extend_context(out.taps.narrow(1, 0, produced), {produced});
  }
  g.decode_s = now_s(device) - t1;
  return g;
}

std::vector<generation> target_generate(target_decoder& target,
                                        const std::vector<std::vector<int64_t>>& prompts,
                                        const speculative_options& o, at::Generator& gen) {
  const auto device = target.target().embedding().device();
  const auto rows = static_cast<int64_t>(prompts.size());
  if (rows == 0 || rows > target.batch())
    throw error(errc::bad_input, "target generation: " + std::to_string(rows)
                                   + " prompts for a batch of " + std::to_string(target.batch()));
  const bool greedy = o.sampling.temperature <= 0;
  int64_t longest = 0;
  for (const auto& p : prompts) {
    if (p.empty())
      throw error(errc::bad_input, "target generation: an empty prompt");
    longest = std::max<int64_t>(longest, static_cast<int64_t>(p.size()));
  }
  if (longest + o.max_new_tokens > target.capacity())
    throw error(errc::bad_input, "target generation: prompts of up to " + std::to_string(longest)
                                   + " + " + std::to_string(o.max_new_tokens)
                                   + " new tokens exceed the " + std::to_string(target.capacity())
                                   + "-position cache");
  const auto b = target.batch();
  const auto ids_opts = at::TensorOptions().dtype(at::kLong);
  auto pick = [&](const at::Tensor& logits) {  // [B, V] → B tokens
    return greedy ? to_host(logits.argmax(-1))
                  : to_host(at::multinomial(sampling_probs(logits, o.sampling), 1, false, gen).squeeze(1));
  };
  target.reset();
  std::vector<generation> out(rows);
  auto t0 = now_s(device);
  // Prefill: rows padded on the right (rows past `rows` are all padding).
  auto ids = at::zeros({b, longest}, ids_opts);
  std::vector<int64_t> last(b, 0);
  for (int64_t r = 0; r < rows; ++r) {
    const auto n = static_cast<int64_t>(prompts[r].size());
    ids[r].narrow(0, 0, n).copy_(at::tensor(prompts[r], ids_opts));
    last[r] = n - 1;
  }
  auto pre = target.forward(ids.to(device), false, at::tensor(last, ids_opts).to(device));
  auto next = pick(pre.logits.select(1, 0));
  std::vector<bool> done(b, true);
  for (int64_t r = 0; r < rows; ++r) {
    target.set_length(r, static_cast<int64_t>(prompts[r].size()));
    out[r].tokens.push_back(next[r]);
    done[r] = std::find(o.stop_ids.begin(), o.stop_ids.end(), next[r]) != o.stop_ids.end()
              || o.max_new_tokens == 1;
  }
  auto t1 = now_s(device);
  while (std::find(done.begin(), done.end(), false) != done.end()) {
    std::vector<int64_t> feed(b, 0);
    for (int64_t r = 0; r < rows; ++r)
      feed[r] = out[r].tokens.back();
    auto step = target.forward(at::tensor(feed, ids_opts).to(device).unsqueeze(1), false);
    next = pick(step.logits.select(1, 0));
    for (int64_t r = 0; r < rows; ++r) {
      if (done[r])
        continue;
      target.set_length(r, target.length(r) + 1);
      out[r].tokens.push_back(next[r]);
      done[r] = std::find(o.stop_ids.begin(), o.stop_ids.end(), next[r]) != o.stop_ids.end()
                || static_cast<int64_t>(out[r].tokens.size()) >= o.max_new_tokens;
    }
  }
  auto t2 = now_s(device);
  for (auto& g : out) {
    g.prefill_s = t1 - t0;
    g.decode_s = t2 - t1;
  }
  return out;
}

} // namespace tandem::gpu
