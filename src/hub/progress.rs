//! Progress reports shaped for both a GUI progress bar and a terminal line.

use std::io::Write;
use std::time::{Duration, Instant};

/// Progress of the file currently downloading.
#[derive(Debug, Clone, PartialEq)]
pub struct DownloadProgress {
    pub file: String,
    /// 1-based position of `file` among the files this run downloads.
    pub file_index: usize,
    pub file_count: usize,
    pub bytes_done: u64,
    pub bytes_total: Option<u64>,
    pub bytes_per_sec: f64,
    pub eta: Option<Duration>,
    /// Set while the download waits to reconnect after its connection broke.
    pub reconnecting: Option<Reconnecting>,
}

/// A transfer that broke and is about to be tried again, from the bytes already received.
#[derive(Debug, Clone, PartialEq)]
pub struct Reconnecting {
    /// 1-based: the attempt about to be made after this wait.
    pub attempt: usize,
    pub attempts: usize,
    pub after: Duration,
    pub reason: String,
}

impl DownloadProgress {
    /// Completed fraction of the current file, when its size is known.
    pub fn fraction(&self) -> Option<f64> {
        self.bytes_total
            .filter(|&total| total > 0)
            .map(|total| (self.bytes_done as f64 / total as f64).min(1.0))
    }
}

/// Reports at most this often so a GUI event queue is not flooded.
const REPORT_INTERVAL: Duration = Duration::from_millis(100);

/// Turns byte counts into throttled [`DownloadProgress`] reports.
///
/// The speed counts only bytes received in this run, so a resumed download
/// does not claim the already-present bytes arrived instantly.
pub(crate) struct ProgressTracker {
    template: DownloadProgress,
    resumed_from: u64,
    started: Instant,
    last_report: Option<Instant>,
}

impl ProgressTracker {
    pub fn new(
        file: &str,
        file_index: usize,
        file_count: usize,
        bytes_done: u64,
        bytes_total: Option<u64>,
    ) -> Self {
        ProgressTracker {
            template: DownloadProgress {
                file: file.to_string(),
                file_index,
                file_count,
                bytes_done,
                bytes_total,
                bytes_per_sec: 0.0,
                eta: None,
                reconnecting: None,
            },
            resumed_from: bytes_done,
            started: Instant::now(),
            last_report: None,
        }
    }

    /// Starts counting again from `bytes_done`, e.g. when a server ignored
    /// a range request and sends the whole file.
    pub fn restart_at(&mut self, bytes_done: u64) {
        self.resumed_from = bytes_done;
        self.template.bytes_done = bytes_done;
        self.started = Instant::now();
    }

    /// Records progress and reports it unless a report went out very
    /// recently; `force` reports regardless (start and end of a file).
    pub fn update(
        &mut self,
        bytes_done: u64,
        force: bool,
        report: &mut dyn FnMut(DownloadProgress),
    ) {
        self.template.bytes_done = bytes_done;
        let now = Instant::now();
        if !force && self.last_report.is_some_and(|t| now - t < REPORT_INTERVAL) {
            return;
        }
        self.last_report = Some(now);
        let elapsed = (now - self.started).as_secs_f64();
        let received = bytes_done.saturating_sub(self.resumed_from) as f64;
        let rate = if elapsed > 0.0 {
            received / elapsed
        } else {
            0.0
        };
        self.template.bytes_per_sec = rate;
        self.template.eta = self.template.bytes_total.and_then(|total| {
            let left = total.saturating_sub(bytes_done) as f64;
            (rate > 0.0).then(|| Duration::from_secs_f64(left / rate))
        });
        report(self.template.clone());
    }

    /// Reports that the transfer broke and is retried after a wait.
    pub fn reconnecting(&mut self, status: Reconnecting, report: &mut dyn FnMut(DownloadProgress)) {
        let mut progress = self.template.clone();
        progress.bytes_per_sec = 0.0;
        progress.eta = None;
        progress.reconnecting = Some(status);
        self.last_report = Some(Instant::now());
        report(progress);
    }
}

/// One terminal line for a progress report, e.g.
/// `[2/6] model.safetensors [#####     ]  50%  12.0 MiB/s  ETA 10s`.
pub fn render_progress_line(progress: &DownloadProgress, bar_width: usize) -> String {
    let head = format!(
        "[{}/{}] {}",
        progress.file_index, progress.file_count, progress.file
    );
    let size = match progress.bytes_total {
        Some(total) => format!(
            "{}/{}",
            human_bytes(progress.bytes_done as f64),
            human_bytes(total as f64)
        ),
        None => human_bytes(progress.bytes_done as f64),
    };
    if let Some(retry) = &progress.reconnecting {
        return format!(
            "{head}  {size}  connection lost ({}); reconnecting in {} s (attempt {} of {})",
            retry.reason,
            retry.after.as_secs_f64().ceil(),
            retry.attempt,
            retry.attempts
        );
    }
    let speed = format!("{}/s", human_bytes(progress.bytes_per_sec));
    match progress.fraction() {
        Some(fraction) => {
            let filled = ((fraction * bar_width as f64).round() as usize).min(bar_width);
            let eta = progress
                .eta
                .map(|eta| format!("  ETA {}s", eta.as_secs()))
                .unwrap_or_default();
            format!(
                "{head} [{}{}] {:>3.0}%  {size}  {speed}{eta}",
                "#".repeat(filled),
                " ".repeat(bar_width - filled),
                fraction * 100.0
            )
        }
        None => format!("{head}  {size}  {speed}"),
    }
}

/// Progress callback for the command line: redraws one line on stderr and
/// ends it once a file is complete.
pub fn stderr_progress() -> impl FnMut(DownloadProgress) {
    move |progress: DownloadProgress| {
        let mut err = std::io::stderr().lock();
        // Terminal output is best effort; a closed stderr must not stop the download.
        let _ = write!(err, "\r{}\x1b[K", render_progress_line(&progress, 30));
        if progress.bytes_total == Some(progress.bytes_done) {
            let _ = writeln!(err);
        }
        let _ = err.flush();
    }
}

fn human_bytes(bytes: f64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut value = bytes;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{value:.0} {}", UNITS[unit])
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_bar_percentage_and_eta() {
        let progress = DownloadProgress {
            file: "model.safetensors".into(),
            file_index: 2,
            file_count: 6,
            bytes_done: 512 * 1024,
            bytes_total: Some(1024 * 1024),
            bytes_per_sec: 1024.0 * 1024.0,
            eta: Some(Duration::from_secs(3)),
            reconnecting: None,
        };
        assert_eq!(
            render_progress_line(&progress, 10),
            "[2/6] model.safetensors [#####     ]  50%  512.0 KiB/1.0 MiB  1.0 MiB/s  ETA 3s"
        );
    }

    #[test]
    fn reports_are_throttled_but_forced_ones_pass() {
        let mut tracker = ProgressTracker::new("f", 1, 1, 0, Some(100));
        let mut seen = Vec::new();
        let mut sink = |p: DownloadProgress| seen.push(p.bytes_done);
        tracker.update(0, true, &mut sink);
        tracker.update(10, false, &mut sink);
        tracker.update(100, true, &mut sink);
        assert_eq!(seen, vec![0, 100]);
    }
}
