//! The OpenCL C source of the kernel families, assembled from `cl/*.cl`.
//!
//! Kernels are generic: shapes, strides, dtypes and op codes are arguments (the strided views
//! in a per-program meta buffer), so each family is one OpenCL program built once per device
//! and reused by every graph (`OpenClDevice` caches built programs by source text). Op and
//! dtype codes are generated here from the IR's own enums, so the two sides cannot disagree.
//!
//! What depends on the device is fixed when it opens, as [`Tuning`], and enters the source as
//! `#define`s: the rows per work group of the 16-lane row kernels (`ROWS`), and which SGEMM
//! tile configurations ([`GEMM_TILES`]) are instantiated from the template `cl/gemm.cl` (each
//! one a kernel of the `Linalg` program, so one build serves every shape). A device therefore
//! still builds each family once.

use std::fmt::Write;

use tenet_ir::{BinaryOp, Distribution, NormOp, PoolKind, ReduceOp, UnaryOp};

use crate::source::{self, Quirks};

/// A group of kernels built as one OpenCL program.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Family {
    /// Elementwise ops, casts, movement, gather and the generated sources.
    Elementwise,
    /// Reductions, softmax and the norms.
    Reduce,
    /// Matrix products, convolution and pooling.
    Linalg,
}

/// One register-tiled SGEMM configuration (`cl/gemm.cl`): work groups of `tx × ty` items,
/// each computing `rm × rn` outputs (a block of `ty·rm` rows by `tx·rn` columns per group),
/// stepping through k `kb` at a time with A's and B's slices staged in local memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct GemmTile {
    pub name: &'static str,
    pub tx: u32,
    pub ty: u32,
    pub rm: u32,
    pub rn: u32,
    pub kb: u32,
}

impl GemmTile {
    pub(crate) const fn threads(&self) -> u32 {
        self.tx * self.ty
    }
    /// Rows of the output block.
    pub(crate) const fn bm(&self) -> u32 {
        self.ty * self.rm
    }
    /// Columns of the output block.
    pub(crate) const fn bn(&self) -> u32 {
        self.tx * self.rn
    }
    /// Local memory of one work group: A's slice `kb × (bm + 4)` and B's `kb × (bn + 4)`.
    pub(crate) const fn local_bytes(&self) -> u64 {
        4 * self.kb as u64 * (self.bm() as u64 + 4 + self.bn() as u64 + 4)
    }
    /// The template's shape rules: micro-tiles in float4 columns, and the A and B slices
    /// loaded as whole float4s per work item.
    const fn valid(&self) -> bool {
        let t = self.threads();
        self.rm.is_multiple_of(4)
            && self.rn.is_multiple_of(4)
            && self.kb.is_multiple_of(4)
            && (self.bm() * self.kb / 4).is_multiple_of(t)
            && (self.bn() * self.kb / 4).is_multiple_of(t)
    }
}

/// The SGEMM tiles, largest first. 128×128 blocks with 8×8 outputs per item is the classic
/// large-matrix shape (CLBlast's and CUTLASS's SGEMMs); 64×64 with 4×4 keeps a device busy
/// on products with few blocks (MiniLM's 4096×384 projections give 96 blocks of 128×128 but
/// 384 of 64×64); 32×32 with 4×4 from 64 items serves narrow products (attention's `P·V`
/// with 32 or 64 columns) and devices whose work groups or local memory are small.
pub(crate) const GEMM_TILES: [GemmTile; 3] = [
    GemmTile {
        name: "k_gemm_128x128",
        tx: 16,
        ty: 16,
        rm: 8,
        rn: 8,
        kb: 16,
    },
    GemmTile {
        name: "k_gemm_64x64",
        tx: 16,
        ty: 16,
        rm: 4,
        rn: 4,
        kb: 16,
    },
    GemmTile {
        name: "k_gemm_32x32",
        tx: 8,
        ty: 8,
        rm: 4,
        rn: 4,
        kb: 16,
    },
];

const _: () = {
    let mut i = 0;
    while i < GEMM_TILES.len() {
        assert!(GEMM_TILES[i].valid());
        i += 1;
    }
};

/// Lanes per row of the row kernels: the summation order's 16 accumulators.
pub(crate) const LANES: u32 = 16;

/// What the kernels' sources take from the device's limits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Tuning {
    /// Rows per work group of the 16-lane row kernels (a power of two, 1 to 16).
    pub rows: u32,
    /// The SGEMM tiles whose work group and local memory the device allows, largest first.
    pub gemm: Vec<GemmTile>,
}

impl Tuning {
    /// From the device's largest work group and its local memory per group.
    pub(crate) fn for_limits(max_group: usize, local_mem: u64) -> Tuning {
        let mut rows = 16u32;
        while rows > 1 && (LANES * rows) as usize > max_group {
            rows /= 2;
        }
        let gemm = GEMM_TILES
            .iter()
            .filter(|t| t.threads() as usize <= max_group && t.local_bytes() <= local_mem)
            .copied()
            .collect();
        Tuning { rows, gemm }
    }
}

impl Family {
    fn body(self) -> &'static str {
        match self {
            Family::Elementwise => include_str!("cl/elementwise.cl"),
            Family::Reduce => include_str!("cl/reduce.cl"),
            Family::Linalg => include_str!("cl/linalg.cl"),
        }
    }

    /// The whole program source: the preamble (pragmas and the project's math library),
    /// op codes, the shared helpers, the device's tuning, then this family's kernels.
    pub(crate) fn source(self, quirks: &Quirks, tuning: &Tuning) -> String {
        let mut s = source::preamble(quirks);
        s.push_str(&op_codes());
        s.push_str(include_str!("cl/common.cl"));
        match self {
            Family::Reduce => {
                let _ = writeln!(s, "#define LANES {LANES}\n#define ROWS {}", tuning.rows);
            }
            Family::Linalg => {
                s.push_str(include_str!("cl/gemm_common.cl"));
                for t in &tuning.gemm {
                    let _ = writeln!(
                        s,
                        "#define GEMM_NAME {}\n#define GEMM_TX {}\n#define GEMM_TY {}\n\
                         #define GEMM_RM {}\n#define GEMM_RN {}\n#define GEMM_KB {}",
                        t.name, t.tx, t.ty, t.rm, t.rn, t.kb
                    );
                    s.push_str(include_str!("cl/gemm.cl"));
                    s.push_str(
                        "#undef GEMM_NAME\n#undef GEMM_TX\n#undef GEMM_TY\n#undef GEMM_RM\n\
                         #undef GEMM_RN\n#undef GEMM_KB\n",
                    );
                }
            }
            Family::Elementwise => {}
        }
        s.push_str(self.body());
        s
    }
}

/// `#define U_NEG 0` and so on for every op enum, from the enums' tags.
fn op_codes() -> String {
    let mut s = String::new();
    let mut put = |prefix: &str, name: &str, tag: u8| {
        let _ = writeln!(s, "#define {prefix}_{} {tag}", name.to_ascii_uppercase());
    };
    for op in UnaryOp::ALL {
        put("U", op.name(), op.tag());
    }
    for op in BinaryOp::ALL {
        put("B", op.name(), op.tag());
    }
    for op in ReduceOp::ALL {
        put("R", op.name(), op.tag());
    }
    for op in NormOp::ALL {
        put("N", op.name(), op.tag());
    }
    for op in PoolKind::ALL {
        put("P", op.name(), op.tag());
    }
    for op in Distribution::ALL {
        put("D", op.name(), op.tag());
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(t: &Tuning) -> Vec<&'static str> {
        t.gemm.iter().map(|g| g.name).collect()
    }

    #[test]
    fn tuning_follows_the_device_limits() {
        let gpu = Tuning::for_limits(1024, 48 << 10);
        assert_eq!(gpu.rows, 16);
        assert_eq!(
            names(&gpu),
            ["k_gemm_128x128", "k_gemm_64x64", "k_gemm_32x32"]
        );
        // 16 KiB of local memory: the 128×128 tile's 16.5 KiB does not fit.
        let small = Tuning::for_limits(256, 16 << 10);
        assert_eq!(names(&small), ["k_gemm_64x64", "k_gemm_32x32"]);
        let tiny = Tuning::for_limits(64, 32 << 10);
        assert_eq!((tiny.rows, names(&tiny)), (4, vec!["k_gemm_32x32"]));
        let none = Tuning::for_limits(16, 1 << 20);
        assert_eq!((none.rows, names(&none)), (1, vec![]));
    }

    #[test]
    fn each_tile_is_one_kernel_of_one_program() {
        let t = Tuning::for_limits(1024, 48 << 10);
        let src = Family::Linalg.source(&Quirks::default(), &t);
        for g in &t.gemm {
            assert_eq!(
                src.matches(&format!("#define GEMM_NAME {}\n", g.name))
                    .count(),
                1
            );
        }
        assert!(src.contains("kernel void k_matmul("));
        let src = Family::Reduce.source(&Quirks::default(), &t);
        assert!(src.contains("#define LANES 16\n#define ROWS 16\n"));
    }
}
