// Layout helpers every view and dialog draws with: sizes at the UI scale, toolbars that wrap,
// widths that fit their labels, dialogs kept on the display, and where a view's figure starts.
#pragma once

namespace kvscope::app {

// Pixels at the current UI scale: views write sizes for scale 1 and wrap them in px().
float px(float at_scale_1);

// Toolbars that wrap: call before each item after the first, with the width the item will
// take (wrap_width helpers below); stays on the line when it fits, else starts a new one.
void toolbar_next(float item_width);
float button_width(const char* label);
// Dialog buttons of one width that holds `widest` at the current UI scale (fixed pixel widths
// cut "Open" and "Cancel" to "Ope" and "Can" at 2x).
float dialog_button_width(const char* widest);
// Modal dialogs stay within the display whatever happens to it while they are open or closed (a
// window resize, a UI scale change): call fit_next_dialog_to_display() before BeginPopupModal
// (centred when it appears, never larger than the display: its contents scroll) and
// keep_dialog_on_screen() inside it (moved back when the display shrank under it).
void fit_next_dialog_to_display();
void keep_dialog_on_screen();
// A framed widget of width `w` followed by its label.
float labelled_width(float w, const char* label);

// Width for a framed widget and its label: `at_scale_1` pixels x UI scale, narrower when the
// window is (at least 60 px).
float fit_width(float at_scale_1, const char* label);

// The view's figure starts below this point (its toolbar is above): PNG/SVG figure exports
// cover the view's area from here down, without controls, tab bars or menus.
void mark_figure_top();

// Presentation (F11, AppUi::presenting): true while a view draws alone over the whole window.
// A view then keeps its figure and its playback controls and leaves out its settings rows (they
// are one F11 away).
bool presenting_view();
void set_presenting_view(bool on);

// The UI scale px() multiplies by (setup_style_and_fonts sets it, app/app_frame.h).
void set_ui_scale(float scale);
// Where the drawing view's figure starts (screen y), or -1 when it did not say
// (mark_figure_top); the frame clears it before each view draws.
float figure_top();
void clear_figure_top();

}  // namespace kvscope::app
