use std::time::Duration;

/// Speed and size figures of one generation, as the status bar and `--json` show them.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct GenerationStats {
    /// Tokens in the prompt, cached or not.
    pub prompt_tokens: usize,
    /// Prompt tokens whose keys and values were already cached from an earlier turn.
    pub reused_tokens: usize,
    /// Prompt tokens run through the model now (`prompt_tokens - reused_tokens`).
    pub prefilled_tokens: usize,
    #[serde(with = "millis")]
    pub prefill_time: Duration,
    /// From the start of the request to the first sampled token.
    #[serde(with = "millis")]
    pub time_to_first_token: Duration,
    pub generated_tokens: usize,
    /// Time spent producing tokens after the first.
    #[serde(with = "millis")]
    pub decode_time: Duration,
    /// Positions of the context in use, and the most it can hold.
    pub context_used: usize,
    pub context_limit: usize,
    pub kv_cache_bytes: usize,
    /// Times results were read back from the device. On a GPU each read waits until the
    /// queue has run dry, so a step should need one.
    pub device_reads: usize,
}

impl GenerationStats {
    /// `None` below two prefilled tokens: running one token (the rest of the prompt was in
    /// the cache) is a decode step, and its rate said nothing about prefill.
    pub fn prefill_tokens_per_second(&self) -> Option<f64> {
        if self.prefilled_tokens < 2 {
            return None;
        }
        per_second(self.prefilled_tokens, self.prefill_time)
    }

    /// Decode speed counts the tokens after the first: the first one's time is prefill's.
    pub fn decode_tokens_per_second(&self) -> Option<f64> {
        per_second(self.generated_tokens.saturating_sub(1), self.decode_time)
    }
}

fn per_second(count: usize, time: Duration) -> Option<f64> {
    (count > 0 && !time.is_zero()).then(|| count as f64 / time.as_secs_f64())
}

mod millis {
    use std::time::Duration;

    pub fn serialize<S: serde::Serializer>(
        duration: &Duration,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.serialize_f64(duration.as_secs_f64() * 1000.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_one_token_prefill_has_no_prefill_speed() {
        let stats = |prefilled_tokens| GenerationStats {
            prompt_tokens: 300,
            reused_tokens: 300 - prefilled_tokens,
            prefilled_tokens,
            prefill_time: Duration::from_millis(40),
            ..GenerationStats::default()
        };
        assert_eq!(stats(1).prefill_tokens_per_second(), None);
        assert_eq!(stats(20).prefill_tokens_per_second(), Some(500.0));
    }
}
