//! A deliberately naive Llama forward pass in f64 loops, written from the Hugging Face
//! modelling code and independent of smolchat's Burn model and loader: the second opinion for
//! head layouts, untied heads and precisions that the golden fixture does not cover. It is
//! itself checked against the transformers golden outputs.

use std::collections::HashMap;
use std::path::Path;

use safetensors::SafeTensors;

pub struct ReferenceLlama {
    config: serde_json::Value,
    weights: HashMap<String, Vec<f64>>,
}

impl ReferenceLlama {
    pub fn load(dir: &Path) -> Self {
        let config: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("config.json")).expect("config.json"))
                .expect("json");
        let bytes = std::fs::read(dir.join("model.safetensors")).expect("model.safetensors");
        let file = SafeTensors::deserialize(&bytes).expect("valid safetensors");
        let weights = file
            .tensors()
            .into_iter()
            .map(|(name, view)| (name, super::to_f64(view.dtype(), view.data())))
            .collect();
        Self { config, weights }
    }

    fn usize(&self, key: &str) -> usize {
        self.config[key]
            .as_u64()
            .unwrap_or_else(|| panic!("config {key}")) as usize
    }

    fn w(&self, name: &str) -> &[f64] {
        self.weights
            .get(name)
            .unwrap_or_else(|| panic!("weight {name}"))
    }

    /// Logits for every position of `tokens`, computed from scratch without any cache.
    pub fn logits(&self, tokens: &[u32]) -> Vec<Vec<f64>> {
        let hidden = self.usize("hidden_size");
        let heads = self.usize("num_attention_heads");
        let kv_heads = self.config["num_key_value_heads"]
            .as_u64()
            .map_or(heads, |v| v as usize);
        let head_dim = self.config["head_dim"]
            .as_u64()
            .map_or(hidden / heads, |v| v as usize);
        let inter = self.usize("intermediate_size");
        let vocab = self.usize("vocab_size");
        let layers = self.usize("num_hidden_layers");
        let eps = self.config["rms_norm_eps"].as_f64().expect("eps");
        let theta = self.config["rope_theta"].as_f64().expect("theta");
        let scaling = &self.config["rope_scaling"];
        let llama3 = (scaling["rope_type"] == "llama3").then(|| {
            let number = |key: &str| scaling[key].as_f64().expect("llama3 scaling field");
            [
                number("factor"),
                number("low_freq_factor"),
                number("high_freq_factor"),
                number("original_max_position_embeddings"),
            ]
        });
        let tied = self.config["tie_word_embeddings"]
            .as_bool()
            .unwrap_or(false);
        let n = tokens.len();

        let embed = self.w("model.embed_tokens.weight");
        let mut x: Vec<Vec<f64>> = tokens
            .iter()
            .map(|&t| embed[t as usize * hidden..(t as usize + 1) * hidden].to_vec())
            .collect();

        for l in 0..layers {
            let p = format!("model.layers.{l}");
            let h: Vec<Vec<f64>> = x
                .iter()
                .map(|row| rms_norm(row, self.w(&format!("{p}.input_layernorm.weight")), eps))
                .collect();
            let q: Vec<Vec<f64>> = h
                .iter()
                .map(|r| {
                    matvec(
                        self.w(&format!("{p}.self_attn.q_proj.weight")),
                        r,
                        heads * head_dim,
                    )
                })
                .collect();
            let k: Vec<Vec<f64>> = h
                .iter()
                .map(|r| {
                    matvec(
                        self.w(&format!("{p}.self_attn.k_proj.weight")),
                        r,
                        kv_heads * head_dim,
                    )
                })
                .collect();
            let v: Vec<Vec<f64>> = h
                .iter()
                .map(|r| {
                    matvec(
                        self.w(&format!("{p}.self_attn.v_proj.weight")),
                        r,
                        kv_heads * head_dim,
                    )
                })
                .collect();
            let q: Vec<Vec<f64>> = q
                .iter()
                .enumerate()
                .map(|(pos, r)| rope(r, pos, head_dim, theta, llama3))
                .collect();
            let k: Vec<Vec<f64>> = k
                .iter()
                .enumerate()
                .map(|(pos, r)| rope(r, pos, head_dim, theta, llama3))
                .collect();
            let mut attn = vec![vec![0.0; heads * head_dim]; n];
            for (i, out) in attn.iter_mut().enumerate() {
                for head in 0..heads {
                    let kv = head / (heads / kv_heads);
                    let qh = &q[i][head * head_dim..(head + 1) * head_dim];
                    let scores: Vec<f64> = (0..=i)
                        .map(|j| {
                            dot(qh, &k[j][kv * head_dim..(kv + 1) * head_dim])
                                / (head_dim as f64).sqrt()
                        })
                        .collect();
                    let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let exps: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                    let sum: f64 = exps.iter().sum();
                    for (j, e) in exps.iter().enumerate() {
                        for d in 0..head_dim {
                            out[head * head_dim + d] += e / sum * v[j][kv * head_dim + d];
                        }
                    }
                }
            }
            for (row, a) in x.iter_mut().zip(&attn) {
                let o = matvec(self.w(&format!("{p}.self_attn.o_proj.weight")), a, hidden);
                row.iter_mut().zip(o).for_each(|(r, o)| *r += o);
            }
            for row in x.iter_mut() {
                let h = rms_norm(
                    row,
                    self.w(&format!("{p}.post_attention_layernorm.weight")),
                    eps,
                );
                let gate = matvec(self.w(&format!("{p}.mlp.gate_proj.weight")), &h, inter);
                let up = matvec(self.w(&format!("{p}.mlp.up_proj.weight")), &h, inter);
                let act: Vec<f64> = gate
                    .iter()
                    .zip(&up)
                    .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                    .collect();
                let down = matvec(self.w(&format!("{p}.mlp.down_proj.weight")), &act, hidden);
                row.iter_mut().zip(down).for_each(|(r, d)| *r += d);
            }
        }
        let head = if tied {
            embed
        } else {
            self.w("lm_head.weight")
        };
        x.iter()
            .map(|row| {
                matvec(
                    head,
                    &rms_norm(row, self.w("model.norm.weight"), eps),
                    vocab,
                )
            })
            .collect()
    }
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// `W x` with `W` stored row-major as `[rows, x.len()]`, as Hugging Face stores projections.
fn matvec(w: &[f64], x: &[f64], rows: usize) -> Vec<f64> {
    let cols = x.len();
    assert_eq!(w.len(), rows * cols, "weight size");
    (0..rows)
        .map(|r| dot(&w[r * cols..(r + 1) * cols], x))
        .collect()
}

fn rms_norm(x: &[f64], weight: &[f64], eps: f64) -> Vec<f64> {
    let inv = 1.0 / (x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64 + eps).sqrt();
    x.iter().zip(weight).map(|(v, w)| v * inv * w).collect()
}

/// rotate_half RoPE: dimension `d` of the first half pairs with `d + head_dim / 2`. With
/// `llama3` (`[factor, low_freq_factor, high_freq_factor, original_context]`), each frequency
/// is scaled as Meta's reference does: slow ones (wavelength over original / low) divided by
/// the factor, fast ones (under original / high) kept, those between interpolated.
fn rope(x: &[f64], pos: usize, head_dim: usize, theta: f64, llama3: Option<[f64; 4]>) -> Vec<f64> {
    let half = head_dim / 2;
    let frequency = |d: usize| {
        let base = theta.powf(-2.0 * d as f64 / head_dim as f64);
        let Some([factor, low, high, original]) = llama3 else {
            return base;
        };
        let wavelength = 2.0 * std::f64::consts::PI / base;
        if wavelength < original / high {
            base
        } else if wavelength > original / low {
            base / factor
        } else {
            let smooth = (original / wavelength - low) / (high - low);
            (1.0 - smooth) * base / factor + smooth * base
        }
    };
    let mut out = x.to_vec();
    for head in 0..x.len() / head_dim {
        let base = head * head_dim;
        for d in 0..half {
            let angle = pos as f64 * frequency(d);
            let (a, b) = (x[base + d], x[base + d + half]);
            out[base + d] = a * angle.cos() - b * angle.sin();
            out[base + d + half] = b * angle.cos() + a * angle.sin();
        }
    }
    out
}
