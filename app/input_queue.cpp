#include "app/input_queue.h"

#define GLFW_INCLUDE_NONE  // the key and action codes only; this file calls no GLFW or GL
#include <GLFW/glfw3.h>

namespace kvscope::app {

void InputQueue::key(int key, int action) {
  if (key < 0 || key >= kKeys) return;
  if (action == GLFW_REPEAT) {
    // GLFW (X11) takes a release followed within 20 ms by a press of the same key for auto-repeat
    // and drops the release; on a loaded X server two separate taps arrive like that. Either
    // way it is a new press: release and press again.
    events_.push_back({false, key, false, 0, 0, 0, false});
    events_.push_back({false, key, true, 0, 0, 0, false});
    return;
  }
  events_.push_back({false, key, action == GLFW_PRESS, 0, 0, 0, false});
}

void InputQueue::button(int button, int action, double time_s) {
  if (button < 0 || button >= kButtons || action == GLFW_REPEAT) return;
  events_.push_back(
      {true, button, action == GLFW_PRESS, time_s, cursor_x_, cursor_y_, has_cursor_});
}

void InputQueue::character(unsigned int c) {
  events_.push_back({false, -1, false, 0, 0, 0, false, c});
}

void InputQueue::cursor(double x, double y) {
  cursor_x_ = static_cast<float>(x);
  cursor_y_ = static_cast<float>(y);
  has_cursor_ = true;
}

bool InputQueue::typed_text(int key, const ImGuiIO& io) const {
  const bool modifier = key_down_[GLFW_KEY_LEFT_CONTROL] || key_down_[GLFW_KEY_RIGHT_CONTROL] ||
                        key_down_[GLFW_KEY_LEFT_ALT] || key_down_[GLFW_KEY_RIGHT_ALT] ||
                        key_down_[GLFW_KEY_LEFT_SUPER] || key_down_[GLFW_KEY_RIGHT_SUPER];
  return io.WantTextInput && !modifier && key >= GLFW_KEY_SPACE && key <= GLFW_KEY_GRAVE_ACCENT;
}

void InputQueue::feed(ImGuiIO& io) {
  double_now_.fill(false);
  std::array<bool, kKeys> key_changed{};
  std::array<bool, kButtons> button_changed{};
  bool pressed = false;
  size_t used = 0;
  for (; used < events_.size(); ++used) {
    const Event& e = events_[used];
    if (e.code < 0) {  // a character: after the keys before it, with this frame's keys
      io.AddInputCharacter(e.ch);
      continue;
    }
    const size_t c = static_cast<size_t>(e.code);
    bool& changed = e.is_button ? button_changed[c] : key_changed[c];
    bool& down = e.is_button ? button_down_[c] : key_down_[c];
    if (down == e.down) continue;  // e.g. a release GLFW sent on losing focus
    if (!e.is_button && typed_text(e.code, io)) {
      down = e.down;  // text comes through ImGui's character queue: no frame of its own
      continue;
    }
    // A second change of one key or button, or a release after a press: the next frame.
    if (changed || (pressed && !e.down)) break;
    if (e.is_button && e.has_pos && (e.x != shown_pos_.x || e.y != shown_pos_.y)) {
      // The pointer moved and pressed (or released) between two frames: ImGui sees it at the
      // new place for one frame first. Tabs (items that allow overlap) take a press only where
      // the previous frame found the pointer: a click on a tab right after the pointer
      // jumped there from another tab did nothing.
      io.MousePos = ImVec2(e.x, e.y);
      break;
    }
    changed = true;
    down = e.down;
    pressed |= e.down;
    if (!e.is_button) continue;
    if (e.has_pos) io.MousePos = ImVec2(e.x, e.y);
    if (e.down) {
      const ImVec2 d(io.MousePos.x - last_press_pos_[c].x, io.MousePos.y - last_press_pos_[c].y);
      const float max_dist = io.MouseDoubleClickMaxDist;
      double_now_[c] = e.time_s - last_press_s_[c] < kDoubleClickS &&
                       d.x * d.x + d.y * d.y < max_dist * max_dist;
      // A third press starts a new pair, as in ImGui.
      last_press_s_[c] = double_now_[c] ? -1e9 : e.time_s;
      last_press_pos_[c] = io.MousePos;
    }
  }
  events_.erase(events_.begin(), events_.begin() + static_cast<long>(used));
  shown_pos_ = io.MousePos;
  hold(io);
}

void InputQueue::after_new_frame(ImGuiIO& io) const {
  // ImGui counted the clicks of this frame by its frame clock; the count by event time replaces
  // it (IsMouseDoubleClicked and Selectable's double-click read MouseClickedCount == 2).
  for (int b = 0; b < kButtons; ++b) {
    if (!io.MouseClicked[b]) continue;
    const bool dbl = double_now_[static_cast<size_t>(b)];
    io.MouseDoubleClicked[b] = dbl;
    io.MouseClickedCount[b] = dbl ? 2 : 1;
  }
}

void InputQueue::hold(ImGuiIO& io) const {
  for (int k = 0; k < kKeys; ++k) io.KeysDown[k] = key_down_[static_cast<size_t>(k)];
  for (int b = 0; b < kButtons; ++b) io.MouseDown[b] = button_down_[static_cast<size_t>(b)];
  io.KeyCtrl = key_down_[GLFW_KEY_LEFT_CONTROL] || key_down_[GLFW_KEY_RIGHT_CONTROL];
  io.KeyShift = key_down_[GLFW_KEY_LEFT_SHIFT] || key_down_[GLFW_KEY_RIGHT_SHIFT];
  io.KeyAlt = key_down_[GLFW_KEY_LEFT_ALT] || key_down_[GLFW_KEY_RIGHT_ALT];
  io.KeySuper = key_down_[GLFW_KEY_LEFT_SUPER] || key_down_[GLFW_KEY_RIGHT_SUPER];
}

}  // namespace kvscope::app
