//! Which SIMD instruction set the kernels use, detected at run time or forced by environment.

use std::sync::OnceLock;

/// A family of kernels. Every level produces the same bits; they differ only in speed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SimdLevel {
    /// Plain Rust, no intrinsics: any machine.
    Portable,
    /// x86-64 AVX2 with FMA (8 lanes).
    Avx2,
    /// x86-64 AVX-512F (16 lanes).
    Avx512,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SimdError {
    #[error("TENET_SIMD={0:?} is not a SIMD level (use avx512, avx2, portable or auto)")]
    Unknown(String),
    #[error("TENET_SIMD={0} was requested but this CPU does not support it (best available: {1})")]
    Unsupported(&'static str, &'static str),
}

impl SimdLevel {
    pub const ALL: [SimdLevel; 3] = [SimdLevel::Portable, SimdLevel::Avx2, SimdLevel::Avx512];

    pub fn name(self) -> &'static str {
        match self {
            SimdLevel::Portable => "portable",
            SimdLevel::Avx2 => "avx2",
            SimdLevel::Avx512 => "avx512",
        }
    }

    /// Whether this CPU can run the level.
    pub fn supported(self) -> bool {
        match self {
            SimdLevel::Portable => true,
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx2 => {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
            }
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx512 => {
                std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// The fastest level this CPU supports.
    pub fn detect() -> SimdLevel {
        *SimdLevel::ALL
            .iter()
            .rev()
            .find(|l| l.supported())
            .unwrap_or(&SimdLevel::Portable)
    }

    /// The level named by `TENET_SIMD` (unset or `auto`: detect), read once per process.
    pub fn from_env() -> Result<SimdLevel, SimdError> {
        static LEVEL: OnceLock<Result<SimdLevel, SimdError>> = OnceLock::new();
        LEVEL
            .get_or_init(|| SimdLevel::parse(std::env::var("TENET_SIMD").ok().as_deref()))
            .clone()
    }

    /// Interpret a requested level (`None` or `auto` means detect).
    pub fn parse(requested: Option<&str>) -> Result<SimdLevel, SimdError> {
        let level = match requested.map(str::trim) {
            None | Some("") | Some("auto") => return Ok(SimdLevel::detect()),
            Some(s) => SimdLevel::ALL
                .into_iter()
                .find(|l| l.name() == s)
                .ok_or_else(|| SimdError::Unknown(s.to_string()))?,
        };
        if level.supported() {
            Ok(level)
        } else {
            Err(SimdError::Unsupported(
                level.name(),
                SimdLevel::detect().name(),
            ))
        }
    }

    /// The level, downgraded to one this CPU supports.
    pub fn or_supported(self) -> SimdLevel {
        if self.supported() {
            self
        } else {
            SimdLevel::detect().min(self)
        }
    }
}

pub(crate) use tenet_reference::math::canonical;

/// [`canonical`] over a slice, in place.
pub(crate) fn canonical_nans(out: &mut [f32]) {
    out.iter_mut().for_each(|v| *v = canonical(*v));
}

/// [`canonical`] in 16 lanes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn canonical16(x: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    let nan = _mm512_set1_ps(tenet_reference::math::NAN);
    _mm512_mask_blend_ps(_mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x), x, nan)
}

/// [`canonical`] in 8 lanes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
pub(crate) fn canonical8(x: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let nan = _mm256_set1_ps(tenet_reference::math::NAN);
    _mm256_blendv_ps(x, nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x))
}

/// The mask of lanes `0..len` of an 8-lane register (all of them from 8 up), for AVX2's masked
/// loads and stores.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
pub(crate) fn mask8(len: usize) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    let iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    _mm256_cmpgt_epi32(_mm256_set1_epi32(len.min(8) as i32), iota)
}

/// The mask of lanes `0..len` of a 16-lane register (all of them from 16 up): the lanes a
/// row's last, partial block may touch.
#[cfg(target_arch = "x86_64")]
pub(crate) fn mask16(len: usize) -> u16 {
    if len >= 16 { 0xffff } else { (1u16 << len) - 1 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parsing() {
        assert_eq!(SimdLevel::parse(Some("portable")), Ok(SimdLevel::Portable));
        assert_eq!(SimdLevel::parse(None), Ok(SimdLevel::detect()));
        assert!(matches!(
            SimdLevel::parse(Some("sse9")),
            Err(SimdError::Unknown(_))
        ));
        assert!(SimdLevel::detect().supported());
    }
}
