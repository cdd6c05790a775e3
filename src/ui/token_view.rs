//! A reply coloured token by token by how likely the model found each one; hovering a token
//! lists what else it considered.

use egui::{Color32, RichText};

use crate::store::StoredToken;

/// Red for unlikely tokens through yellow to green for near-certain ones.
pub fn probability_colour(probability: f32, dark: bool) -> Color32 {
    let p = probability.clamp(0.0, 1.0);
    let (r, g) = if p < 0.5 {
        (1.0, p * 2.0)
    } else {
        (2.0 - p * 2.0, 1.0)
    };
    let alpha = if dark { 0.45 } else { 0.35 };
    Color32::from_rgba_unmultiplied(
        (r * 255.0) as u8,
        (g * 200.0) as u8,
        40,
        (alpha * 255.0) as u8,
    )
}

pub fn show(ui: &mut egui::Ui, tokens: &[StoredToken]) {
    let dark = ui.visuals().dark_mode;
    ui.horizontal_wrapped(|ui| {
        ui.spacing_mut().item_spacing.x = 0.0;
        for token in tokens {
            let shown = token.text.replace('\n', "\\n\n");
            let text = RichText::new(shown)
                .monospace()
                .background_color(probability_colour(token.probability, dark));
            let response = ui.add(egui::Label::new(text).sense(egui::Sense::hover()));
            response.on_hover_ui(|ui| alternatives(ui, token));
        }
    });
}

fn alternatives(ui: &mut egui::Ui, token: &StoredToken) {
    ui.label(format!(
        "{:?}: {:.1}%",
        token.text,
        token.probability * 100.0
    ));
    if token.alternatives.is_empty() {
        return;
    }
    ui.separator();
    egui::Grid::new("alternatives")
        .striped(true)
        .show(ui, |ui| {
            for (text, probability) in &token.alternatives {
                ui.monospace(format!("{text:?}"));
                ui.label(format!("{:.1}%", probability * 100.0));
                ui.end_row();
            }
        });
}
