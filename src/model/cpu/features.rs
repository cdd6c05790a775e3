//! What the CPU offers the hand-written kernels, read once, and the setting that caps it.
//!
//! `SMOLCHAT_MAX_CPU=avx2` makes every kernel take the path a CPU without AVX-512 takes (most
//! laptops have none), `avxvnni` the path of one that has AVX-VNNI beside AVX2 (Intel's
//! laptops since Alder Lake), and `portable` the plain-Rust one, so that one machine can time
//! and check the paths other machines run. Every kernel of ours asks here
//! rather than detecting features itself, so the cap reaches all of them; the loops the
//! compiler vectorizes (`multiversion`) and the `gemm` crate still choose for themselves.

use std::sync::OnceLock;

/// The variable that caps the features the kernels use.
pub const MAX_CPU_VARIABLE: &str = "SMOLCHAT_MAX_CPU";

/// The instruction sets a kernel may use; each implies the ones above it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Features {
    /// AVX2 with FMA and F16C, which every x86-64 CPU with AVX2 has.
    pub avx2: bool,
    /// AVX-VNNI: AVX2's integer dot products of pairs in one instruction, as AVX-512 VNNI's
    /// on 256 bits.
    pub avx_vnni: bool,
    /// AVX-512 F, BW and VL.
    pub avx512: bool,
    /// AVX-512 VNNI: integer dot products of pairs and quads in one instruction.
    pub avx512_vnni: bool,
    /// AVX-512 BF16: products of bf16 pairs.
    pub avx512_bf16: bool,
    /// AVX-512 whose 512-bit instructions take no more of the core than two 256-bit ones
    /// (AMD's Zen 4 and 5), so that kernels bound by instructions go wider. On Intel's
    /// cores 512-bit instructions have two ports where 256-bit ones have three, and the
    /// 256-bit kernels ran faster there.
    pub wide: bool,
}

impl Features {
    /// Whether the CPU multiplies bytes with VNNI in either encoding (AVX-512 VNNI or
    /// AVX-VNNI).
    pub fn vnni(self) -> bool {
        self.avx512_vnni || self.avx_vnni
    }

    /// Whether the decode kernels read weights of `bits` (4, 5, 6 read stepped, or 8 in
    /// blocks of 32) interleaved, rows in lanes (`matvec::Interleaving`): 4- and 6-bit ones
    /// with VNNI, and with AVX2 and no AVX-512 too, where 16-bit products cost what the row
    /// kernel's cost and nothing is added across lanes; 5- and 8-bit ones on that last kind
    /// alone, whose kernel alone reads them.
    pub fn interleaves(self, bits: u32) -> bool {
        let avx2_alone = self.avx2 && !self.avx512;
        match bits {
            4 | 6 => self.vnni() || avx2_alone,
            5 | 8 => avx2_alone && !self.vnni(),
            _ => false,
        }
    }

    /// Whether float weights are laid out by lane (`weights::by_lane_at`) for the AVX2
    /// kernels that read them so: where the AVX-512 tiles, which read a row's sixteen lanes
    /// in one register, do not run.
    pub fn lays_out_floats_by_lane(self) -> bool {
        self.avx2 && !self.avx512
    }
}

/// The features of this CPU, less what `SMOLCHAT_MAX_CPU` turns off.
pub fn cpu() -> Features {
    static FEATURES: OnceLock<Features> = OnceLock::new();
    *FEATURES.get_or_init(|| {
        let detected = detected();
        match std::env::var(MAX_CPU_VARIABLE) {
            Ok(cap) => match capped(detected, &cap) {
                Some(features) => features,
                None => {
                    eprintln!(
                        "{MAX_CPU_VARIABLE}={cap:?} is not one of avx512, avxvnni, avx2 or \
                         portable; \
                         using every feature this CPU has"
                    );
                    detected
                }
            },
            Err(_) => detected,
        }
    })
}

/// `features` less those above `cap`, or `None` for a cap that names no level.
fn capped(features: Features, cap: &str) -> Option<Features> {
    match cap.trim().to_ascii_lowercase().as_str() {
        "avx512" | "" => Some(features),
        "avxvnni" => Some(Features {
            avx2: features.avx2,
            avx_vnni: features.avx_vnni,
            ..Features::default()
        }),
        "avx2" => Some(Features {
            avx2: features.avx2,
            ..Features::default()
        }),
        "portable" => Some(Features::default()),
        _ => None,
    }
}

#[cfg(target_arch = "x86_64")]
fn detected() -> Features {
    use std::arch::is_x86_feature_detected;
    let avx2 = is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c");
    let avx512 = avx2
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl");
    Features {
        avx2,
        avx_vnni: avx2 && is_x86_feature_detected!("avxvnni"),
        avx512,
        avx512_vnni: avx512 && is_x86_feature_detected!("avx512vnni"),
        avx512_bf16: avx512 && is_x86_feature_detected!("avx512bf16"),
        wide: avx512 && amd(),
    }
}

/// Whether the CPU is AMD's, by the vendor string of CPUID leaf 0.
#[cfg(target_arch = "x86_64")]
fn amd() -> bool {
    let leaf = std::arch::x86_64::__cpuid(0);
    let vendor = [leaf.ebx, leaf.edx, leaf.ecx].map(u32::to_le_bytes);
    vendor.as_flattened() == b"AuthenticAMD"
}

#[cfg(not(target_arch = "x86_64"))]
fn detected() -> Features {
    Features::default()
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: Features = Features {
        avx2: true,
        avx_vnni: true,
        avx512: true,
        avx512_vnni: true,
        avx512_bf16: true,
        wide: true,
    };

    #[test]
    fn a_cap_turns_off_what_lies_above_it_and_nothing_adds_a_feature() {
        assert_eq!(capped(ALL, "avx512"), Some(ALL));
        assert_eq!(
            capped(ALL, " AVX2 "),
            Some(Features {
                avx2: true,
                ..Features::default()
            })
        );
        assert_eq!(
            capped(ALL, "avxvnni"),
            Some(Features {
                avx2: true,
                avx_vnni: true,
                ..Features::default()
            })
        );
        assert_eq!(capped(ALL, "portable"), Some(Features::default()));
        assert_eq!(
            capped(Features::default(), "avx2"),
            Some(Features::default())
        );
        assert_eq!(capped(ALL, "sse9"), None);
    }
}
