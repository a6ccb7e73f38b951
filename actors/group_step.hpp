#pragma once
/// The data-parallel group step: the coordinator's view of its drafters'
/// NCCL group and of the lockstep step in flight (DESIGN.md §3,
/// messages/drafter.hpp).  N > 1 drafters train one step together: every
/// rank gets a work item, their captured steps all-reduce the gradient, and
/// the step counts only when the reports say where every state is.
///
///                 begin_forming
///       ┌──────┐ ─────────────▶ ┌─────────┐  member_up × N, set_id,
///       │ none │                │ forming │  member_joined × N
///       └──────┘ ◀───────────── └─────────┘ ─────────────┐
///         ▲  ▲    join_failed        │ dissolve          ▼
///         │  └───────────────────────┘              ┌───────┐
///         │          dissolve (a rank failed)       │ ready │ ◀─────────┐
///         ├──────────────────────────────────────── └───────┘           │
///         │                                 dispatch │   ▲ finish_step  │
///         │                                          ▼   │ (all N in)   │
///         │  dissolve                          ┌──────────┐             │
///         ├─────────────────────────────────── │ stepping │ ── report ─┐│
///         │                                    └──────────┘ ◀──────────┘│
///         │                            rank_failed │                    │
///         │                                        ▼                    │
///         │  dissolve                          ┌─────────┐  resolve     │
///         └─────────────────────────────────── │ failing │ ─────────────┘
///                                              └─────────┘ (survivors' reports
///                                           report, rank_failed   all in)
///
/// `none`: no group (at the start, after a failure).  `forming` generation g:
/// first every drafter answers a heartbeat (a restarted one once restored),
/// then rank 0 makes the NCCL id and every rank joins; the first failure of
/// g ends it (later ones of g are its consequences, not the drafters'
/// faults).  `ready`: the group is up and no step is in flight; every live
/// replica holds the weights of the ledger's step.  `stepping`: N reports
/// due.  `failing`: a rank failed inside the step; the survivors' reports,
/// still due, say where their states are: the step before (their guarded
/// update was skipped) or the step itself (the collective had completed);
/// `resolve` decides (a known state: training continues from a survivor;
/// anywhere else: from the newest checkpoint).  A resolved or finished step
/// leaves the group `ready`; the coordinator then dissolves it when a rank
/// failed (`dissolve` is allowed from any phase).
///
/// A callback of generation g acts only while `forming(g)`: replies of an
/// older group can never act.  Transitions out of the wrong phase throw
/// std::logic_error (the coordinator checks `current()` first).
///
/// Plain C++ (no CAF, no LibTorch), in the manner of actors/ledger.hpp: the
/// coordinator actor owns one and is the only thread that touches it; it
/// does the messaging, this decides.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace tandem {

/// What the group step needs of a rank's step_report (messages/descriptors.hpp).
struct rank_report {
  int32_t drafter = 0;
  int64_t step = 0;           ///< the update count its state holds after the step
  bool finite = true;         ///< false: the averaged gradient was not finite, update skipped
  bool loss_finite = true;    ///< its own loss is finite
  bool contributed = true;    ///< false: it trained a copy with zero weight (epoch tail)
  bool group_failed = false;  ///< its collective did not complete
};

class group_step {
public:
  enum class phase : uint8_t { none, forming, ready, stepping, failing };

  /// How a finished step (every rank reported, none failed) ends, checked
  /// in this order.
  struct verdict {
    enum class kind : uint8_t {
      trained,            ///< every rank at `step`: the step counts
      collective_failed,  ///< `drafter` (the first to say so) is the failure
      not_finite,         ///< every rank skipped the update; `drafter` the culprit
      disagree            ///< ranks at different steps: `drafter` at `other_step`, the first at `step`
    };
    kind what = kind::trained;
    int32_t drafter = -1;
    int64_t step = 0;
    int64_t other_step = 0;
    int32_t first_drafter = -1;
    bool all_skipped = false;          ///< not_finite: every rank skipped the update
    std::vector<rank_report> reports;  ///< in arrival order
  };

  /// A step that a rank failed inside, once the survivors reported.
  struct resolution {
    std::vector<std::pair<int32_t, std::string>> failed;  ///< the ranks that failed, with why
    std::vector<rank_report> reports;  ///< the survivors', in arrival order
    /// Every survivor is at the step before or the step itself (and one
    /// reported): training continues from a survivor, losing no step.
    bool known = false;
    /// Known, and a survivor applied the whole step: its batches are trained.
    bool step_trained = false;
    /// Where training continues: `before + 1` when step_trained, else `before`.
    int64_t step = 0;
    /// The survivors whose reports count the step (at `step`, finite), in
    /// arrival order; empty unless step_trained.
    std::vector<int32_t> completed;
    /// Whether survivor `r` holds the state training continues from.
    bool holds_state(const rank_report& r) const { return known && r.step == step; }
  };

  explicit group_step(int32_t world);

  phase current() const { return phase_; }
  int32_t world() const { return world_; }
  int64_t generation() const { return generation_; }  ///< groups begun so far
  /// The NCCL id of the group formed or being formed (empty when none).
  const std::vector<uint8_t>& nccl_id() const { return nccl_id_; }
  /// Hands the id over to abort that group's communicators; empties it.
  std::vector<uint8_t> take_id();

  // Forming ---------------------------------------------------------------

  /// none → forming: a new generation; returns it.
  int64_t begin_forming();
  /// Whether generation `gen` is the one being formed (a reply may act).
  bool forming(int64_t gen) const { return phase_ == phase::forming && generation_ == gen; }
  /// A drafter answered generation `gen`'s heartbeat.  True for the N-th
  /// answer: every drafter is up, ask rank 0 for the id.
  bool member_up(int64_t gen);
  /// Rank 0 made generation `gen`'s NCCL id.  False for a stale reply.
  bool set_id(int64_t gen, std::vector<uint8_t> id);
  /// A rank joined generation `gen`.  True for the N-th: forming → ready.
  bool member_joined(int64_t gen);
  /// A drafter could not come up or join generation `gen`: forming → none.
  /// True only for the first failure of `gen` (the drafter's fault).
  bool join_failed(int64_t gen);

  // Steps -----------------------------------------------------------------

  /// ready → stepping: N work items left, `batches` the real ones.
  void dispatch(std::vector<int64_t> batches);
  /// A step is in flight with reports due (stepping, or failing before resolve).
  bool in_step() const {
    return (phase_ == phase::stepping || phase_ == phase::failing) && reports_due_ > 0;
  }
  int32_t reports_due() const { return reports_due_; }
  /// The reports of the step in flight so far, in arrival order.
  const std::vector<rank_report>& reports() const { return reports_; }
  /// Whether a report of the step in flight says its collective failed.
  bool collective_failed() const;

  enum class report_kind : uint8_t {
    stale,     ///< no step in flight (a step cut short, already handled): nothing to account
    wait,      ///< more reports due
    complete,  ///< the last report of a step: call finish_step
    resolve    ///< the last survivor's report of a failed step: call resolve
  };
  /// A rank's report (the coordinator checked the sender's incarnation).
  report_kind report(const rank_report& r);

  /// stepping|failing → failing: drafter `d` failed inside the step in
  /// flight (its report, if it sent one, no longer counts: its state is
  /// gone with it).  True when no report is due any more: call resolve.
  bool rank_failed(int32_t d, std::string why);

  /// stepping with no report due → ready: how the step ends.
  verdict finish_step(int64_t before);
  /// failing with no report due → ready: where training continues, given
  /// the ledger's step `before`.
  resolution resolve(int64_t before);
  /// The real batches of the step in flight (or just ended); empties them.
  std::vector<int64_t> take_batches();

  /// any → none: the group is broken (a rank failed) or abandoned.
  void dissolve();

private:
  void require(phase p, const char* what) const;

  int32_t world_;
  phase phase_ = phase::none;
  int64_t generation_ = 0;
  std::vector<uint8_t> nccl_id_;
  int32_t up_ = 0;      ///< heartbeat answers of the group being formed
  int32_t joined_ = 0;  ///< join replies of the group being formed
  int32_t reports_due_ = 0;
  std::vector<rank_report> reports_;
  std::vector<int64_t> batches_;
  std::vector<std::pair<int32_t, std::string>> failed_;
};

const char* to_string(group_step::phase p);

} // namespace tandem
