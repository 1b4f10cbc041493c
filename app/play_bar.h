// The playback bar the Walk and Teaching views share: to the first step, one step back,
// play / pause, one step forward, to the end. The buttons are always in this order and place (the
// toolbar never moves under the mouse while a walk plays); what each does is the view's.
#pragma once

#include <functional>
#include <string>

namespace kvscope::app {

struct AppState;

struct PlayBar {
  std::function<void()> first, back, toggle, forward, last;  // the buttons' actions
  bool playing = false;
  bool can_back = true;     // first and back are greyed out otherwise
  bool can_forward = true;  // forward and last (and play, unless playing) likewise
  const char* first_label = "|<";
  const char* back_label = "<";
  const char* forward_label = ">";
  const char* last_label = ">|";
  const char* hint = nullptr;  // tooltip of the bar's last button, e.g. its keys
  // Non-empty: the forward and last buttons are recorded as "<record> step" and "<record> run"
  // (AppState::ui_items, for the GUI tests).
  std::string record;
};

// Draws the bar on the current line (the caller places it, e.g. with toolbar_next and
// play_bar_width) and runs the action of the button clicked. `s` receives the recorded items
// (PlayBar::record); null records none.
void draw_play_bar(AppState* s, const PlayBar& bar);
// Its width, for toolbar_next.
float play_bar_width(const PlayBar& bar);

}  // namespace kvscope::app
