//! Decode speed and memory over the last minute, to see slowdowns as the context fills.

use egui_plot::{Corner, Legend, Line, Plot, PlotPoints};

use super::state::{AppState, HISTORY_WINDOW};

pub fn show(ui: &mut egui::Ui, state: &AppState) {
    ui.label("Last minute: decode tok/s and memory (MiB)");
    if state.history().is_empty() {
        ui.label(egui::RichText::new("No reply generated yet.").weak());
        return;
    }
    let now = state.now_seconds();
    let points = |value: fn(&super::state::StatsSample) -> f64| -> PlotPoints<'static> {
        state
            .history()
            .iter()
            .map(|sample| [sample.seconds - now, value(sample)])
            .collect()
    };
    Plot::new("live_stats")
        .height(140.0)
        // Recent samples sit at the right edge, so the legend goes left where it hides nothing.
        .legend(Legend::default().position(Corner::LeftTop))
        .include_x(-HISTORY_WINDOW.as_secs_f64())
        .include_x(0.0)
        .include_y(0.0)
        .allow_drag(false)
        .allow_zoom(false)
        .allow_scroll(false)
        .show(ui, |plot| {
            plot.line(Line::new("tok/s", points(|s| s.tokens_per_second)));
            plot.line(Line::new("MiB", points(|s| s.resident_mib)));
        });
}
