//! The look, as `docs/design.md` sets it out: one type scale, one spacing and the colours of
//! both themes, given to egui's dark and light styles once at start, so that "System" switches
//! between two designed looks. Views take their colours from here, never as literals.

use egui::epaint::Shadow;
use egui::{Color32, CornerRadius, FontFamily, FontId, Stroke, TextStyle, Visuals};

/// The type scale, in points: body text at 15 reads like a chat app's, not a form's.
const HEADING: f32 = 20.0;
const BODY: f32 = 15.0;
const BUTTON: f32 = 14.0;
const SMALL: f32 = 12.0;
const MONOSPACE: f32 = 13.5;

/// The chat column's widest: lines longer than about 90 characters are hard to follow, and on
/// a wide screen the column stays in the middle.
pub const MAX_CHAT_WIDTH: f32 = 760.0;

/// Rounded corners: bubbles and cards more than controls.
pub const BUBBLE_RADIUS: u8 = 12;
pub const CARD_RADIUS: u8 = 8;
const CONTROL_RADIUS: u8 = 6;

pub fn apply(ctx: &egui::Context) {
    ctx.style_mut_of(egui::Theme::Dark, |style| shape(style, true));
    ctx.style_mut_of(egui::Theme::Light, |style| shape(style, false));
}

fn shape(style: &mut egui::Style, dark: bool) {
    style.text_styles = [
        (
            TextStyle::Heading,
            FontId::new(HEADING, FontFamily::Proportional),
        ),
        (TextStyle::Body, FontId::new(BODY, FontFamily::Proportional)),
        (
            TextStyle::Button,
            FontId::new(BUTTON, FontFamily::Proportional),
        ),
        (
            TextStyle::Small,
            FontId::new(SMALL, FontFamily::Proportional),
        ),
        (
            TextStyle::Monospace,
            FontId::new(MONOSPACE, FontFamily::Monospace),
        ),
    ]
    .into();
    let spacing = &mut style.spacing;
    spacing.item_spacing = egui::vec2(8.0, 6.0);
    spacing.button_padding = egui::vec2(8.0, 3.0);
    spacing.interact_size.y = 24.0;
    spacing.menu_margin = egui::Margin::same(8);
    style.visuals = visuals(if dark { &DARK } else { &LIGHT });
}

/// One theme's colours, as `docs/design.md` lists them.
struct Palette {
    /// egui's own theme, which the rest of the look starts from.
    base: fn() -> Visuals,
    text: Color32,
    /// Selections, the focused field, links.
    accent: Color32,
    /// How strongly a selection is filled with the accent.
    selection: f32,
    panel: Color32,
    window: Color32,
    faint: Color32,
    /// Text fields' fill.
    field: Color32,
    /// Controls' outlines at rest.
    outline: Color32,
    /// The user's turns, as bubbles on the right; replies have no fill.
    user_bubble: Color32,
}

const DARK: Palette = Palette {
    base: Visuals::dark,
    text: Color32::from_gray(0xe0),
    accent: Color32::from_rgb(0x6e, 0xa8, 0xfe),
    selection: 0.45,
    panel: Color32::from_gray(0x1c),
    window: Color32::from_gray(0x22),
    faint: Color32::from_gray(0x26),
    field: Color32::from_gray(0x14),
    outline: Color32::from_gray(0x4a),
    user_bubble: Color32::from_rgb(0x2b, 0x36, 0x4a),
};

/// egui's light theme leaves text fields without a border or fill and checkboxes faint: here
/// every field and control has an outline and fields are white on a grey panel.
const LIGHT: Palette = Palette {
    base: Visuals::light,
    text: Color32::from_gray(0x1e),
    accent: Color32::from_rgb(0x1f, 0x5f, 0xd1),
    selection: 0.25,
    panel: Color32::from_gray(0xf4),
    window: Color32::WHITE,
    faint: Color32::from_gray(0xea),
    field: Color32::WHITE,
    outline: Color32::from_gray(0xa8),
    user_bubble: Color32::from_rgb(0xe3, 0xec, 0xfa),
};

fn visuals(palette: &Palette) -> Visuals {
    let mut visuals = (palette.base)();
    visuals.widgets.noninteractive.fg_stroke.color = palette.text;
    visuals.hyperlink_color = palette.accent;
    visuals.selection.bg_fill = palette.accent.gamma_multiply(palette.selection);
    visuals.selection.stroke = Stroke::new(1.0, palette.accent);
    visuals.panel_fill = palette.panel;
    visuals.window_fill = palette.window;
    visuals.faint_bg_color = palette.faint;
    visuals.extreme_bg_color = palette.field;
    calm(&mut visuals, palette.outline);
    visuals
}

/// Thin outlines on every control at rest, rounded corners, no heavy shadows.
fn calm(visuals: &mut Visuals, outline: Color32) {
    let widgets = &mut visuals.widgets;
    widgets.inactive.bg_stroke = Stroke::new(1.0, outline);
    widgets.noninteractive.bg_stroke = Stroke::new(1.0, outline.gamma_multiply(0.6));
    for state in [
        &mut widgets.noninteractive,
        &mut widgets.inactive,
        &mut widgets.hovered,
        &mut widgets.active,
        &mut widgets.open,
    ] {
        state.corner_radius = CornerRadius::same(CONTROL_RADIUS);
    }
    visuals.window_corner_radius = CornerRadius::same(CARD_RADIUS);
    visuals.menu_corner_radius = CornerRadius::same(CARD_RADIUS);
    visuals.popup_shadow = Shadow {
        offset: [0, 2],
        blur: 8,
        spread: 0,
        color: Color32::from_black_alpha(40),
    };
}

/// The fill of the user's turns.
pub fn user_bubble(visuals: &Visuals) -> Color32 {
    if visuals.dark_mode {
        DARK.user_bubble
    } else {
        LIGHT.user_bubble
    }
}
