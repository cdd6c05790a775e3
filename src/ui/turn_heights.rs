//! How tall each message of the open chat was when last drawn, so that the chat view can
//! skip the ones off screen: laying out every message's Markdown each frame made a
//! 500-message chat cost tens of milliseconds a frame while scrolling or typing.

/// What a message's height depends on besides the column's width: its text (by length, as
/// it only grows while streamed), the version shown, whether it is the last message (which
/// carries more actions), and whether a reply is being written in the chat (which hides
/// every message's actions).
#[derive(Clone, Copy, PartialEq)]
pub struct Shape {
    pub text_len: usize,
    pub variant: usize,
    pub last: bool,
    pub generating: bool,
}

#[derive(Default)]
pub struct TurnHeights {
    /// The chat, column width and token view the heights were measured for; any change
    /// forgets them all.
    measured_for: Option<(String, u32, bool)>,
    heights: Vec<Option<(Shape, f32)>>,
}

impl TurnHeights {
    /// Starts a frame of chat `id` at column `width`: heights measured otherwise are dropped.
    pub fn begin(&mut self, id: &str, width: f32, show_tokens: bool, messages: usize) {
        let width = width.round() as u32;
        let same = self
            .measured_for
            .as_ref()
            .is_some_and(|(measured, w, tokens)| {
                measured == id && *w == width && *tokens == show_tokens
            });
        if !same {
            self.measured_for = Some((id.to_string(), width, show_tokens));
            self.heights.clear();
        }
        self.heights.resize(messages, None);
    }

    /// Message `index`'s height when it was last drawn in this shape.
    pub fn get(&self, index: usize, shape: Shape) -> Option<f32> {
        match self.heights.get(index) {
            Some(Some((measured, height))) if *measured == shape => Some(*height),
            _ => None,
        }
    }

    pub fn set(&mut self, index: usize, shape: Shape, height: f32) {
        if let Some(slot) = self.heights.get_mut(index) {
            *slot = Some((shape, height));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Shape, TurnHeights};

    const SHAPE: Shape = Shape {
        text_len: 10,
        variant: 0,
        last: false,
        generating: false,
    };

    #[test]
    fn a_height_holds_for_the_shape_chat_and_width_it_was_measured_at() {
        let mut heights = TurnHeights::default();
        heights.begin("a", 700.0, false, 3);
        assert_eq!(heights.get(1, SHAPE), None);
        heights.set(1, SHAPE, 42.0);
        assert_eq!(heights.get(1, SHAPE), Some(42.0));
        let longer = Shape {
            text_len: 11,
            ..SHAPE
        };
        assert_eq!(heights.get(1, longer), None, "the text grew");
        let writing = Shape {
            generating: true,
            ..SHAPE
        };
        assert_eq!(
            heights.get(1, writing),
            None,
            "actions hidden while a reply is written"
        );
        heights.begin("a", 700.2, false, 4);
        assert_eq!(
            heights.get(1, SHAPE),
            Some(42.0),
            "the same width, one more message"
        );
        heights.begin("a", 650.0, false, 4);
        assert_eq!(
            heights.get(1, SHAPE),
            None,
            "a narrower column wraps differently"
        );
        heights.set(1, SHAPE, 50.0);
        heights.begin("b", 650.0, false, 4);
        assert_eq!(heights.get(1, SHAPE), None, "another chat");
        heights.set(1, SHAPE, 50.0);
        heights.begin("b", 650.0, true, 4);
        assert_eq!(
            heights.get(1, SHAPE),
            None,
            "the token view draws replies otherwise"
        );
    }
}
