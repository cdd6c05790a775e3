use clap::Args;

use crate::text::{SamplingError, SamplingParams};

/// Sampling flags shared by every generating command; unset flags keep the chat defaults.
#[derive(Debug, Args)]
pub struct SamplingArgs {
    /// 0 = always the likeliest token (greedy).
    #[arg(long, allow_negative_numbers = true)]
    temperature: Option<f32>,
    #[arg(long, allow_negative_numbers = true)]
    top_p: Option<f32>,
    /// 0 = off.
    #[arg(long, allow_negative_numbers = true)]
    top_k: Option<usize>,
    /// 0 = off.
    #[arg(long, allow_negative_numbers = true)]
    min_p: Option<f32>,
    /// 1 = off.
    #[arg(long, allow_negative_numbers = true)]
    repetition_penalty: Option<f32>,
    #[arg(long, allow_negative_numbers = true)]
    seed: Option<u64>,
}

impl SamplingArgs {
    pub fn params(&self) -> Result<SamplingParams, SamplingError> {
        let defaults = SamplingParams::default();
        let params = SamplingParams {
            temperature: self.temperature.unwrap_or(defaults.temperature),
            top_p: self.top_p.unwrap_or(defaults.top_p),
            top_k: self.top_k.unwrap_or(defaults.top_k),
            min_p: self.min_p.unwrap_or(defaults.min_p),
            repetition_penalty: self
                .repetition_penalty
                .unwrap_or(defaults.repetition_penalty),
            seed: self.seed.unwrap_or(defaults.seed),
        };
        params.validate()?;
        Ok(params)
    }
}
