// Method lists of the app (the Method view's combos, the Error view's sweep, the Output view):
// a method the open capture cannot run is listed greyed, with the reason in its tooltip
// (method_unavailable, engine/eval/protocol.h), instead of being refused when it runs.
#pragma once

#include <imgui.h>

#include <map>
#include <string>
#include <vector>

#include "app/app_state.h"

namespace kvscope::app {

// Every method the app offers, in the registry's order, so that each method and wrapper the
// engine registers is reachable without being named here: all_methods() (the engine's methods
// and the wrapped ones `--methods all` runs), then each wrapper of wrapper_names() around each
// score-ranking method not listed yet. The method combos, the Error view's sweep, the Output and
// Theory views list from here.
std::vector<const Method*> app_methods();

// The colours of methods drawn together (one plot, one list): each method its own colour of
// kMethodPalette (app/colormap.h), by its place in app_methods(), unless a method placed before
// it there holds that colour in this drawing; then the next free one, and past the palette a
// hue of its own. So no two methods drawn together share a colour, and a method keeps its
// colour in every plot where nothing claims it first.
class MethodColours {
 public:
  explicit MethodColours(const std::vector<std::string>& drawn);
  ImU32 operator()(const std::string& name) const;  // a name not drawn: grey

 private:
  std::map<std::string, ImU32> colour_;
};

// Why `method` (with the parameters of whichever slot runs it) cannot run on the open capture;
// "" when it can or no capture is open.
std::string method_unavailable_here(const AppState& s, const Method& method);

// The parameters that let `method` run without the output projection W_O (a Choice parameter
// with an "identity" choice, criticalkv's projection), or nullopt when it has none or needs no
// W_O. The app offers them as the method's approximate entry.
std::optional<ParamValues> without_output_projection(const Method& method);

// One entry of a combo list: selectable when the capture can run the method, greyed with the
// reason (hover) when it cannot. Returns true when it was picked. `item` names the entry for
// the GUI tests (record_item); the reason is also recorded as "<item>:unavailable".
bool method_selectable(AppState& s, const Method& method, bool selected, const std::string& item);
// The same for a check box of a list (Error view's sweep); an unavailable method cannot be
// ticked, but one already ticked can be unticked.
bool method_checkbox(AppState& s, const Method& method, bool* on, const std::string& item);

}  // namespace kvscope::app
