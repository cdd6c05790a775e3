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
    // Short units: the y axis's label runs along a plot 90 px high ("decode tok/s" was cut).
    plot(ui, state, "Decode speed", "tok/s", |s| s.tokens_per_second);
    plot(ui, state, "Memory", "MiB", |s| s.resident_mib);
}

/// Seconds of history the time axis spans: what there is, from 10 s up to the whole window,
/// so that the first seconds of a reply are not a sliver at the right of a minute.
fn span(state: &AppState, now: f64) -> f64 {
    let oldest = state.history().front().map_or(now, |sample| sample.seconds);
    (now - oldest).clamp(10.0, HISTORY_WINDOW.as_secs_f64())
}

/// A plot 90 points high has room for one label on its value axis, so the figures that give
/// it its scale are written above it: the latest and the highest.
fn plot(
    ui: &mut egui::Ui,
    state: &AppState,
    title: &str,
    unit: &str,
    value: fn(&StatsSample) -> f64,
) {
    let latest = state.history().back().map_or(0.0, value);
    let highest = state.history().iter().map(value).fold(0.0, f64::max);
    ui.label(format!(
        "{title}: {latest:.1} {unit} now, {highest:.1} {unit} at most"
    ));
    let id = title;
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
        .x_axis_formatter(|mark, _| seconds_ago(mark.value))
        .include_x(-span(state, now))
        .include_x(0.0)
        .include_y(0.0)
        .allow_drag(false)
        .allow_zoom(false)
        .allow_scroll(false)
        .show(ui, |plot| plot.line(Line::new(unit, points)));
}

/// The time axis's label at `x` (seconds from now, 0 or less): "-0" was written at now, and
/// the plot's margin past now gave negative ages.
fn seconds_ago(x: f64) -> String {
    // `+ 0.0` turns a negative zero into zero.
    format!("{:.0}", (-x).max(0.0) + 0.0)
}

#[cfg(test)]
mod tests {
    use super::seconds_ago;

    #[test]
    fn the_time_axis_reads_whole_seconds_ago() {
        assert_eq!(seconds_ago(0.0), "0");
        assert_eq!(seconds_ago(-0.0), "0");
        assert_eq!(seconds_ago(-0.4), "0");
        assert_eq!(seconds_ago(2.0), "0");
        assert_eq!(seconds_ago(-30.0), "30");
    }
}
