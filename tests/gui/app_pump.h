// Runs the app's frame loop without a window (reconcile() every 2 ms, as the frame loop would)
// until `done` holds; false after `seconds`. Shared by the app's unit tests.
#pragma once

#include <chrono>
#include <thread>

#include "app/app_state.h"

namespace kvscope::app::testing {

template <typename Pred>
bool pump_until(AppState& s, Pred done, int seconds = 20) {
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    s.reconcile();
    if (done()) return true;
    if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(seconds)) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

}  // namespace kvscope::app::testing
