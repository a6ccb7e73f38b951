#pragma once
/// Eval protocol (config [eval]).  Detached: one thread of its own, all its
/// device work on it (its own copy of the frozen target, on its own GPU, a
/// GPU it shares, or the CPU).
///
///   coordinator                            eval
///     | -- snapshot_desc -----------------> |  copies the weights, releases the handle,
///     |                                     |  then decodes one held-out prompt per
///     |                                     |  message it sends itself (eval_next), so
///     |                                     |  its mailbox is served between prompts
///     | <--------------------- eval_event   |  τ of that step's weights (or an error)
///     | -- (shutdown) --------------------> |  quits (an evaluation in progress is dropped)
///
/// One evaluation at a time: the coordinator asks for the next only after
/// the answer.  The answer is also the "eval" line of metrics.jsonl (the
/// coordinator forwards it as a run_event, messages/metrics.hpp).

#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include "messages/atoms.hpp"
#include "messages/descriptors.hpp"
#include "messages/metrics.hpp"
#include "messages/vitals.hpp"

namespace tandem {

/// The eval actor's own "decode the next prompt" (never sent by others).
using eval_next_atom = caf::atom_constant<caf::atom("evalnext")>;

using eval_actor = caf::typed_actor<
  caf::replies_to<snapshot_desc>::with<eval_event>,
  caf::reacts_to<eval_next_atom>,
  caf::reacts_to<shutdown_atom>,
  vitals_protocol>;

} // namespace tandem
