#pragma once
/// The default handler of Tandem's actors (STYLE.md habit 7): a message that
/// no handler of the actor's protocol matches is logged and answered with
/// errc::unexpected_message, "<name> cannot handle <message>".

#include <string>

#include <caf/message.hpp>
#include <caf/message_view.hpp>
#include <caf/result.hpp>
#include <caf/scheduled_actor.hpp>
#include <spdlog/spdlog.h>

#include "messages/errors.hpp"

namespace tandem {

/// Installs the default handler on `self`; `name` is its state's name
/// ("tandem.prefetch"), a string that outlives the actor.
inline void install_default_handler(caf::scheduled_actor* self, const char* name) {
  self->set_default_handler([name](caf::scheduled_actor* me, caf::message_view& view)
                              -> caf::result<caf::message> {
    auto msg = view.copy_content_to_message();
    spdlog::error("{} (actor {}) cannot handle {}", name, me->id(), caf::to_string(msg));
    return make_error(errc::unexpected_message, std::string(name) + " cannot handle "
                                                  + caf::to_string(msg));
  });
}

} // namespace tandem
