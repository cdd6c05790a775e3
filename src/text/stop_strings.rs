//! Ending a reply at a string the caller chose (OpenAI's `stop`), which may span several
//! tokens and never reaches the caller: text that could still become a stop string is held
//! back until it cannot.

/// What one push let through: text safe to show and the items (tokens) that made it.
#[derive(Debug, Clone, PartialEq)]
pub struct Released<T> {
    pub text: String,
    pub items: Vec<T>,
    /// A stop string was found: `text` ends just before it and generation should end.
    pub stopped: bool,
}

/// Holds back the end of the text while it is the beginning of a stop string. Items are let
/// through whole, with the text they brought, so a token's log-probability goes out with its
/// text; the items that only make up the stop string itself are dropped with it.
#[derive(Debug, Clone)]
pub struct StopStrings<T> {
    stops: Vec<String>,
    held: String,
    /// Each held item and the byte length of the text it brought.
    items: Vec<(usize, T)>,
}

impl<T> StopStrings<T> {
    /// Empty strings never match: they are refused where the stops are read.
    pub fn new(stops: Vec<String>) -> Self {
        Self {
            stops: stops.into_iter().filter(|stop| !stop.is_empty()).collect(),
            held: String::new(),
            items: Vec::new(),
        }
    }

    /// Adds one item's text.
    pub fn push(&mut self, text: &str, item: T) -> Released<T> {
        self.held.push_str(text);
        self.items.push((text.len(), item));
        if let Some(found) = self.earliest_stop() {
            return self.release_stopped(found);
        }
        let keep = self.longest_partial_stop();
        let mut end = 0;
        let mut count = 0;
        for (len, _) in &self.items {
            if end + len > self.held.len() - keep {
                break;
            }
            end += len;
            count += 1;
        }
        let text = self.held.drain(..end).collect();
        let items = self.items.drain(..count).map(|(_, item)| item).collect();
        Released {
            text,
            items,
            stopped: false,
        }
    }

    /// The generation ended: lets everything through, up to a stop string in `text` (the
    /// last characters the detokenizer held) or in what was held here.
    pub fn finish(&mut self, text: &str) -> Released<T> {
        self.held.push_str(text);
        if let Some(found) = self.earliest_stop() {
            return self.release_stopped(found);
        }
        Released {
            text: std::mem::take(&mut self.held),
            items: self.items.drain(..).map(|(_, item)| item).collect(),
            stopped: false,
        }
    }

    fn earliest_stop(&self) -> Option<usize> {
        self.stops
            .iter()
            .filter_map(|stop| self.held.find(stop.as_str()))
            .min()
    }

    /// Lets through the text before `at` and the items that brought any of it.
    fn release_stopped(&mut self, at: usize) -> Released<T> {
        let mut start = 0;
        let mut items = Vec::new();
        for (len, item) in self.items.drain(..) {
            if start < at {
                items.push(item);
            }
            start += len;
        }
        let mut text = std::mem::take(&mut self.held);
        text.truncate(at);
        Released {
            text,
            items,
            stopped: true,
        }
    }

    /// The length of the longest end of the held text that begins some stop string.
    fn longest_partial_stop(&self) -> usize {
        self.stops
            .iter()
            .flat_map(|stop| {
                (1..stop.len().min(self.held.len() + 1))
                    .filter(|&len| stop.is_char_boundary(len) && self.held.ends_with(&stop[..len]))
            })
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (Vec<String>, Vec<Vec<usize>>, bool) {
        let mut filter = StopStrings::new(stops.iter().map(|s| s.to_string()).collect());
        let (mut texts, mut items) = (Vec::new(), Vec::new());
        for (index, piece) in pieces.iter().enumerate() {
            let released = filter.push(piece, index);
            texts.push(released.text);
            items.push(released.items);
            if released.stopped {
                return (texts, items, true);
            }
        }
        let released = filter.finish("");
        texts.push(released.text);
        items.push(released.items);
        (texts, items, released.stopped)
    }

    #[test]
    fn without_stops_everything_passes_at_once() {
        let (texts, items, stopped) = run(&[], &["a", "b"]);
        assert_eq!(texts, ["a", "b", ""]);
        assert_eq!(items, [vec![0], vec![1], vec![]]);
        assert!(!stopped);
    }

    #[test]
    fn a_stop_across_tokens_is_held_back_and_cut() {
        let (texts, items, stopped) = run(&["END"], &["Hello E", "N", "D more"]);
        assert_eq!(texts, ["", "", "Hello "]);
        // The first token brought "Hello ", so it goes out; the others made up the stop.
        assert_eq!(items, [vec![], vec![], vec![0]]);
        assert!(stopped);
    }

    #[test]
    fn a_false_start_is_let_through_when_it_cannot_be_a_stop() {
        let (texts, items, stopped) = run(&["END"], &["a E", "x", "y"]);
        assert_eq!(texts, ["", "a Ex", "y", ""]);
        assert_eq!(items, [vec![], vec![0, 1], vec![2], vec![]]);
        assert!(!stopped);
    }

    #[test]
    fn the_earliest_of_several_stops_wins_and_the_end_is_searched() {
        let (texts, _, stopped) = run(&["zz", "b"], &["abzz"]);
        assert_eq!(texts, ["a"]);
        assert!(stopped);
        let mut filter = StopStrings::new(vec!["\n\n".to_string()]);
        assert_eq!(filter.push("one\n", 0).text, "");
        let last = filter.finish("\ntwo");
        assert_eq!(
            (last.text.as_str(), last.items, last.stopped),
            ("one", vec![0], true)
        );
    }
}
