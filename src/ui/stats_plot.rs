//! Decode speed and memory over the last minute, to see slowdowns as the context fills: two
//! plots, as the two figures have different units and scales.

use egui_plot::{Line, Plot, PlotPoints};

use super::state::{AppState, HISTORY_WINDOW, StatsSample};

pub fn show(ui: &mut egui::Ui, state: &AppState) {
    if state.history().is_empty() {
        ui.label(
            egui::RichText::new("Decode speed and memory appear here while a reply is written.")
                .weak(),
        );
        return;
    }
    plot(ui, state, "decode_speed", "decode tok/s", |s| {
        s.tokens_per_second
    });
    plot(ui, state, "memory", "memory MiB", |s| s.resident_mib);
}

fn plot(ui: &mut egui::Ui, state: &AppState, id: &str, unit: &str, value: fn(&StatsSample) -> f64) {
    let now = state.now_seconds();
    let points: PlotPoints<'static> = state
        .history()
        .iter()
        .map(|sample| [sample.seconds - now, value(sample)])
        .collect();
    Plot::new(id)
        .height(90.0)
        .x_axis_label("seconds ago")
        .y_axis_label(unit)
        .x_axis_formatter(|mark, _| format!("{:.0}", -mark.value))
        .include_x(-HISTORY_WINDOW.as_secs_f64())
        .include_x(0.0)
        .include_y(0.0)
        .allow_drag(false)
        .allow_zoom(false)
        .allow_scroll(false)
        .show(ui, |plot| plot.line(Line::new(unit, points)));
}
