// Prefetch protocol (messages/prefetch.hpp): the real prefetch actor of
// actors/prefetch.cpp, scheduled on CAF's deterministic test coordinator,
// with its real CPU engine over a dataset written by the test.  Asserts the
// credit discipline (never a batch without a credit), that an epoch hands
// out each of this rank's samples once and then says `exhausted`, re-issue,
// release, and failures reaching whoever watches the actor (a dataset that
// does not open; a shard whose bytes changed, refused before its first batch).
#define CAF_SUITE prefetch_protocol

#include <fstream>
#include <set>

#include "gpu/data/sha256.hpp"

#include "workers.hpp"  // before dsl.hpp (its `inject` macro)

#include "dsl.hpp"

using namespace tandem;
using namespace tandem::test;

namespace {

struct fixture : worker_fixture_base, test_coordinator_fixture<config> {
  coordinator_actor coord = sys.spawn(recording_coordinator, log);

  fixture() : worker_fixture_base(24) {}

  ~fixture() override {
    caf::anon_send_exit(coord, caf::exit_reason::kill);
  }

  prefetch_actor spawn(int32_t index = 0, gpu::prefetch_engine_options o = {}) {
    if (o.dataset.empty())
      o = prefetch_options(dataset);
    return spawn_prefetch<caf::no_spawn_options>(sys, index, o, coord);
  }

  std::multiset<int64_t> sent_samples() const {
    std::multiset<int64_t> out;
    for (auto& b : log->batches)
      out.insert(b.sample_ids.begin(), b.sample_ids.end());
    return out;
  }
};

std::multiset<int64_t> range(int64_t from, int64_t to) {
  std::multiset<int64_t> out;
  for (int64_t i = from; i < to; ++i)
    out.insert(i);
  return out;
}

} // namespace

CAF_TEST_FIXTURE_SCOPE(prefetch_protocol_tests, fixture)

CAF_TEST(a prefetch reports its cursor throughput and padding as vitals) {
  auto p = spawn(1);
  self->send(p, epoch_atom::value, int64_t{0}, int64_t{1}, std::vector<int64_t>{3, 5});
  self->send(p, credit_atom::value, int32_t{3});
  run();
  CAF_REQUIRE_EQUAL(log->batches.size(), 3u);
  auto a = ask<actor_vitals>(sys, p, vitals_atom::value);
  run();
  CAF_REQUIRE(a->value.has_value());
  const auto& v = *a->value;
  CAF_CHECK_EQUAL(v.role, "prefetch");
  CAF_CHECK_EQUAL(v.index, 1);
  CAF_CHECK_EQUAL(v.handled, 3u);  // epoch, credit, this request
  CAF_CHECK_EQUAL(v.last_message, "credit");
  auto f = figures_of(v);
  int64_t samples = 0, real = 0, total = 0;
  for (const auto& b : log->batches) {
    samples += static_cast<int64_t>(b.sample_ids.size());
    real += b.real_tokens;
    total += b.rows * b.seq_len;
  }
  CAF_CHECK_EQUAL(f["epoch"], 0.0);
  CAF_CHECK_EQUAL(f["epoch_samples"], 24.0 - 2.0);  // this rank's order less the two done
  CAF_CHECK_EQUAL(f["epoch_sent"], static_cast<double>(samples));
  CAF_CHECK_EQUAL(f["batches"], 3.0);
  CAF_CHECK_EQUAL(f["credit"], 0.0);
  CAF_CHECK_EQUAL(f["reissued"], 0.0);
  CAF_CHECK_GREATER(total, real);  // the fixture's samples do not fill a row
  CAF_CHECK_LESS(std::abs(f["padding_waste"] - (1.0 - static_cast<double>(real) / static_cast<double>(total))), 1e-12);
  CAF_CHECK_GREATER_OR_EQUAL(f["samples_per_s"], 0.0);
  for (auto& b : log->batches)
    self->send(p, release_atom::value, b.handle);
  self->send(p, shutdown_atom::value);
  run();
}

CAF_TEST(a prefetch stages batches only against credits) {
  auto p = spawn(2);
  self->send(p, epoch_atom::value, int64_t{0}, int64_t{1}, std::vector<int64_t>{});
  expect((epoch_atom, int64_t, int64_t, std::vector<int64_t>), from(self).to(p).with(_, 0, 1, _));
  disallow((batch_desc), from(p).to(coord));
  run();
  CAF_CHECK(log->batches.empty());  // no credit, no batch
  self->send(p, credit_atom::value, int32_t{2});
  expect((credit_atom, int32_t), from(self).to(p).with(_, 2));
  expect((batch_desc), from(p).to(coord));
  expect((batch_desc), from(p).to(coord));
  disallow((batch_desc), from(p).to(coord));
  run();
  CAF_REQUIRE_EQUAL(log->batches.size(), 2u);
  CAF_CHECK_EQUAL(gpu::transport::live_handles(), handles_at_start + 2);
  for (auto& b : log->batches) {
    CAF_CHECK_EQUAL(b.batch_id, -1);  // the coordinator's ledger assigns it
    CAF_CHECK_EQUAL(b.epoch, 0);
    CAF_CHECK_EQUAL(b.source, 2);
    CAF_CHECK_EQUAL(b.rows, 1);
    CAF_CHECK_EQUAL(b.seq_len, 256);
    CAF_CHECK_EQUAL(b.where.device, -1);
    CAF_CHECK(b.handle != 0);
    CAF_CHECK(!b.sample_ids.empty());
    int64_t tokens = 0;
    for (auto id : b.sample_ids)
      tokens += sample_length(id);
    CAF_CHECK_EQUAL(b.real_tokens, tokens);
    CAF_CHECK_LESS_OR_EQUAL(b.real_tokens, 256);
  }
  CAF_CHECK(log->batches[0].handle != log->batches[1].handle);
  self->send(p, credit_atom::value, int32_t{1});
  run();
  CAF_CHECK_EQUAL(log->batches.size(), 3u);
  // Released batches free their payload.
  for (auto& b : log->batches)
    self->send(p, release_atom::value, b.handle);
  run();
  CAF_CHECK_EQUAL(gpu::transport::live_handles(), handles_at_start);
  self->send(p, shutdown_atom::value);
  run();
}

CAF_TEST(an epoch hands out every sample once then says exhausted) {
  auto p = spawn(0);
  self->send(p, epoch_atom::value, int64_t{0}, int64_t{1}, std::vector<int64_t>{});
  self->send(p, credit_atom::value, int32_t{100});
  run();
  CAF_CHECK(sent_samples() == range(0, 24));
  CAF_REQUIRE_EQUAL(log->exhausted.size(), 1u);
  CAF_CHECK_EQUAL(log->exhausted[0].first, 0);
  CAF_CHECK_EQUAL(log->exhausted[0].second, 0);
  CAF_CHECK_EQUAL(log->order.back(), "exhausted");  // after the last batch
  for (auto& b : log->batches)
    self->send(p, release_atom::value, b.handle);
  run();
  CAF_CHECK_EQUAL(gpu::transport::live_handles(), handles_at_start);
  // A resumed epoch skips the samples already committed.
  log->batches.clear();
  std::vector<int64_t> done;
  for (int64_t i = 0; i < 10; ++i)
    done.push_back(i);
  self->send(p, epoch_atom::value, int64_t{1}, int64_t{2}, done);
  run();
  CAF_CHECK(sent_samples() == range(10, 24));
  CAF_REQUIRE_EQUAL(log->exhausted.size(), 2u);
  CAF_CHECK_EQUAL(log->exhausted[1].second, 1);
  for (auto& b : log->batches) {
    CAF_CHECK_EQUAL(b.epoch, 1);
    self->send(p, release_atom::value, b.handle);
  }
  run();
  CAF_CHECK_EQUAL(gpu::transport::live_handles(), handles_at_start);
}

CAF_TEST(re-issued samples are packed first even after the epoch ran out) {
  auto p = spawn(0);
  self->send(p, epoch_atom::value, int64_t{0}, int64_t{1}, std::vector<int64_t>{});
  self->send(p, credit_atom::value, int32_t{100});
  run();
  CAF_REQUIRE_EQUAL(log->exhausted.size(), 1u);
  const auto before = log->batches.size();
  self->send(p, reissue_atom::value, std::vector<int64_t>{5, 17});
  run();
  CAF_REQUIRE_EQUAL(log->batches.size(), before + 1);
  CAF_CHECK(std::multiset<int64_t>(log->batches.back().sample_ids.begin(),
                                   log->batches.back().sample_ids.end())
            == (std::multiset<int64_t>{5, 17}));
  CAF_CHECK_EQUAL(log->exhausted.size(), 2u);  // and says so again
  for (auto& b : log->batches)
    self->send(p, release_atom::value, b.handle);
  run();
  CAF_CHECK_EQUAL(gpu::transport::live_handles(), handles_at_start);
}

CAF_TEST(re-issued samples wait for a credit) {
  auto p = spawn(0);
  self->send(p, epoch_atom::value, int64_t{0}, int64_t{1}, std::vector<int64_t>{});
  self->send(p, credit_atom::value, int32_t{1});
  run();
  CAF_REQUIRE_EQUAL(log->batches.size(), 1u);
  self->send(p, reissue_atom::value, std::vector<int64_t>{20});
  run();
  CAF_CHECK_EQUAL(log->batches.size(), 1u);
  self->send(p, credit_atom::value, int32_t{1});
  run();
  CAF_REQUIRE_EQUAL(log->batches.size(), 2u);
  CAF_CHECK_EQUAL(log->batches[1].sample_ids.front(), 20);
  for (auto& b : log->batches)
    self->send(p, release_atom::value, b.handle);
  run();
}

CAF_TEST(a dataset that does not open ends the prefetch with bad_input naming it) {
  auto o = prefetch_options(tmp.dir / "no_such_dataset");
  auto p = spawn(1, o);
  auto ex = watch(sys, p);
  run();
  CAF_REQUIRE_EQUAL(ex->reasons.size(), 1u);
  CAF_CHECK(is(ex->reasons[0], errc::bad_input));
  auto text = sys.render(ex->reasons[0]);
  CAF_MESSAGE(text);
  CAF_CHECK(contains(text, "prefetch 1"));
  CAF_CHECK(contains(text, "no_such_dataset"));
  CAF_CHECK(log->batches.empty());
}

CAF_TEST(a shard whose bytes changed ends the prefetch with bad_input before any batch) {
  // Issue 19: one flipped low bit in a token after the manifest was written
  // is a valid token id; the prefetch's shard verification (sha256, in the
  // background, before the shard's first batch) refuses it, and the batch
  // is never sent.
  const auto dir = tmp.dir / "flipped";
  write_dataset(dir, 24);
  const auto shard = dir / "shard-00000.safetensors";
  auto manifest = nlohmann::json::parse(std::ifstream(dir / "manifest.json"));
  const auto recorded = gpu::data::sha256_file_hex(shard);
  manifest["shards"][0]["sha256"] = recorded;
  std::ofstream(dir / "manifest.json") << manifest.dump(2);
  {
    // The first token of the last sample: its low bit.
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    uint64_t header = 0;
    f.read(reinterpret_cast<char*>(&header), 8);
    const int64_t tokens_at = 8 + static_cast<int64_t>(header) + 8 * 25;  // after offsets[25]
    int64_t before_last = 0;
    for (int64_t k = 0; k < 23; ++k)
      before_last += sample_length(k);
    f.seekg(tokens_at + 4 * before_last);
    char low = 0;
    f.read(&low, 1);
    low ^= 1;
    f.seekp(tokens_at + 4 * before_last);
    f.write(&low, 1);
  }
  const auto actual = gpu::data::sha256_file_hex(shard);
  CAF_REQUIRE(actual != recorded);
  auto p = spawn(0, prefetch_options(dir));
  auto ex = watch(sys, p);
  self->send(p, epoch_atom::value, int64_t{0}, int64_t{1}, std::vector<int64_t>{});
  self->send(p, credit_atom::value, int32_t{4});
  run();
  CAF_REQUIRE_EQUAL(ex->reasons.size(), 1u);
  CAF_CHECK(is(ex->reasons[0], errc::bad_input));
  const auto text = sys.render(ex->reasons[0]);
  CAF_MESSAGE(text);
  CAF_CHECK(contains(text, "prefetch 0"));
  CAF_CHECK(contains(text, shard.string()));
  CAF_CHECK(contains(text, "sha256 is " + actual));
  CAF_CHECK(contains(text, "shards[0].sha256 = '" + recorded + "'"));
  CAF_CHECK(log->batches.empty());
  CAF_CHECK_EQUAL(gpu::transport::live_handles(), handles_at_start);
}

CAF_TEST(an unexpected message is answered with unexpected_message) {
  auto p = spawn(0);
  auto a = ask<std::string>(sys, caf::actor_cast<caf::actor>(p), std::string("hello"));
  run();
  CAF_REQUIRE(a->error.has_value());
  CAF_CHECK(is(*a->error, errc::unexpected_message));
  CAF_CHECK(contains(sys.render(*a->error), "tandem.prefetch cannot handle"));
  self->send(p, shutdown_atom::value);
  run();
}

CAF_TEST(shutdown ends the prefetch) {
  auto p = spawn(0);
  auto ex = watch(sys, p);
  run();
  self->send(p, shutdown_atom::value);
  expect((shutdown_atom), from(self).to(p));
  run();
  CAF_REQUIRE_EQUAL(ex->reasons.size(), 1u);
  CAF_CHECK(ex->reasons[0] == caf::exit_reason::normal);
}

CAF_TEST_FIXTURE_SCOPE_END()
