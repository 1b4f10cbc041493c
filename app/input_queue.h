// Input events in the order they happened, given to ImGui one change per key or button per frame.
//
// Dear ImGui 1.86 (Debian 12) reads keys and mouse buttons as states sampled once per frame
// (io.KeysDown, io.MouseDown; the GLFW backend ORs in "pressed since the last frame"). Events
// that arrive between two frames therefore merge: a key tapped and released is never seen, and a
// double-click whose two clicks fall between two frames (80 ms apart while a frame of the
// software-rendered window takes 130 ms) is one long press: the Open dialog's double-click did
// nothing. The GLFW callbacks queue every event here instead; each frame takes, in order, at most
// one press or release of each key and button (the rest waits for the next frame, which the
// loop draws at once), and a release that follows a press of this frame waits too, so that
// Ctrl+O released as fast as xdotool does is still seen as a chord. A press or release of a
// button is given at the pointer position where it happened, after one frame that shows the
// pointer there (so the widget under it is hovered before it is clicked), and a double-click is
// decided from the times the two presses arrived, not from the frame clock (two presses three
// frames apart are still a double-click when the frames are slow). Typed characters wait in the
// same queue: ImGui drops characters that arrive while it sees Ctrl held, so a path typed right
// after Ctrl+A (both between two slow frames) lost its first characters when they went to ImGui
// at once while Ctrl's release still waited here.
//
// Keys and buttons are GLFW codes (ImGui 1.86's GLFW backend indexes io.KeysDown by them).
#pragma once

#include <imgui.h>

#include <array>
#include <vector>

namespace kvscope::app {

class InputQueue {
 public:
  static constexpr int kKeys = 512;
  static constexpr int kButtons = 5;
  // Two presses of a button within this many seconds and ImGui's io.MouseDoubleClickMaxDist
  // make a double-click (desktop defaults are 400-500 ms; ImGui's own 300 ms counted in slow
  // frames missed real double-clicks).
  static constexpr double kDoubleClickS = 0.5;

  // From the GLFW callbacks. `action`: GLFW_PRESS, GLFW_RELEASE or GLFW_REPEAT.
  void key(int key, int action);
  void button(int button, int action, double time_s);
  void cursor(double x, double y);
  void character(unsigned int c);  // GLFW's character callback (the backend's is replaced)

  // After the backend's NewFrame (which set io.MousePos, io.MouseDown and io.KeysDown from its
  // own view) and before ImGui::NewFrame: the queued events this frame takes.
  void feed(ImGuiIO& io);
  // After ImGui::NewFrame: the double-clicks of this frame, by event time.
  void after_new_frame(ImGuiIO& io) const;
  // The state fed so far, without taking events (frames drawn for an export in between).
  void hold(ImGuiIO& io) const;
  // Events wait for a later frame.
  bool pending() const { return !events_.empty(); }

 private:
  // A printable key without Ctrl, Alt or Super while a text field has the keyboard: typed text,
  // which ImGui reads from its character queue, not from key states (a path typed by xdotool
  // would otherwise take two frames per character).
  bool typed_text(int key, const ImGuiIO& io) const;
  // One queue for keys and buttons: their order matters (Ctrl, then O, then the release of Ctrl).
  struct Event {
    bool is_button;
    int code;  // key or button
    bool down;
    double time_s;  // buttons: when the event arrived
    float x, y;     // buttons: the pointer position then
    bool has_pos;
    unsigned int ch = 0;  // a typed character (is_button false, code -1)
  };
  std::vector<Event> events_;
  std::array<bool, kKeys> key_down_{};
  std::array<bool, kButtons> button_down_{};
  std::array<double, kButtons> last_press_s_{-1e9, -1e9, -1e9, -1e9, -1e9};
  std::array<ImVec2, kButtons> last_press_pos_{};
  std::array<bool, kButtons> double_now_{};
  ImVec2 shown_pos_{-1e30f, -1e30f};  // the pointer position ImGui saw in the last frame
  float cursor_x_ = 0, cursor_y_ = 0;
  bool has_cursor_ = false;
};

}  // namespace kvscope::app
