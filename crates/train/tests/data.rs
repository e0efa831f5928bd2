//! The real datasets as `tenet_train::data` loads them: counts, the digits split, label
//! histograms (the published ones: every class present), pixel ranges and grids. Needs them in
//! the model cache (`tenet models fetch digits mnist`; `.ci/run` fetches them); without them the
//! tests say they were skipped and pass, as the real-model tests do.

use tenet_models::fetch::{DIGITS, MNIST, ModelPackage, cached};
use tenet_train::data::{self, Dataset};

/// The dataset from the user's cache, or `None` after telling stderr why the caller skips.
fn load_or_skip(pkg: &ModelPackage) -> Option<Dataset> {
    match cached(pkg) {
        Ok(dir) => {
            let d = data::load(pkg.name).expect("the fetched dataset loads");
            assert_eq!(d, data::load_from(pkg.name, &dir).unwrap());
            Some(d)
        }
        Err(e) => {
            // Straight to stderr: the test harness would swallow eprintln!.
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "SKIPPED: {e}");
            None
        }
    }
}

fn histogram(y: &[i64], classes: usize) -> Vec<usize> {
    let mut h = vec![0; classes];
    for &c in y {
        h[c as usize] += 1;
    }
    h
}

/// Every value is `k / steps` for an integer `k` in `0..=steps`, and the extremes are seen.
fn assert_grid(x: &[f32], steps: f32, max: f32, what: &str) {
    let (mut lo, mut hi) = (f32::INFINITY, f32::NEG_INFINITY);
    for &v in x {
        assert!(
            v.is_finite() && (0.0..=1.0).contains(&v),
            "{what}: pixel {v}"
        );
        assert_eq!(
            (v * steps).fract(),
            0.0,
            "{what}: pixel {v} is not k/{steps}"
        );
        lo = lo.min(v);
        hi = hi.max(v);
    }
    assert_eq!((lo, hi), (0.0, max), "{what}: pixel range");
}

#[test]
fn digits() {
    let Some(d) = load_or_skip(&DIGITS) else {
        return;
    };
    assert_eq!(d.name, "digits");
    assert_eq!(d.sample_shape, [1, 8, 8]);
    assert_eq!((d.sample_len(), d.classes), (64, 10));
    assert_eq!((d.train_len(), d.test_len()), (1438, 359));
    assert_eq!(d.train_x.len(), 1438 * 64);
    assert_eq!(d.test_x.len(), 359 * 64);
    // sklearn's published class counts over all 1797 samples, and the split's test set (every
    // fifth sample: every class there, unevenly).
    let test = histogram(&d.test_y, 10);
    let train = histogram(&d.train_y, 10);
    let all: Vec<usize> = train.iter().zip(&test).map(|(a, b)| a + b).collect();
    assert_eq!(all, [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]);
    assert_eq!(test, [27, 21, 34, 52, 34, 28, 31, 43, 47, 42]);
    // The file's first row (a 0): `0,0,5,13,9,1,0,0,...`.
    assert_eq!(d.train_y[0], 0);
    assert_eq!(
        &d.train_x[..8],
        [0.0, 0.0, 5.0, 13.0, 9.0, 1.0, 0.0, 0.0].map(|v| v / 16.0)
    );
    assert_grid(&d.train_x, 16.0, 1.0, "digits train");
    assert_grid(&d.test_x, 16.0, 1.0, "digits test");
}

#[test]
fn mnist() {
    let Some(d) = load_or_skip(&MNIST) else {
        return;
    };
    assert_eq!(d.name, "mnist");
    assert_eq!(d.sample_shape, [1, 28, 28]);
    assert_eq!((d.sample_len(), d.classes), (784, 10));
    assert_eq!((d.train_len(), d.test_len()), (60_000, 10_000));
    assert_eq!(d.train_x.len(), 60_000 * 784);
    assert_eq!(d.test_x.len(), 10_000 * 784);
    // MNIST's published class counts: the 60k training set (here its 50k train and 10k
    // validation parts) and the 10k test set.
    assert_eq!(
        histogram(&d.train_y, 10),
        [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
    );
    assert_eq!(
        histogram(&d.test_y, 10),
        [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
    );
    // Pixels are k/256, k in 0..=255, as stored; the mean is MNIST's familiar 0.13.
    assert_grid(&d.train_x, 256.0, 255.0 / 256.0, "mnist train");
    assert_grid(&d.test_x, 256.0, 255.0 / 256.0, "mnist test");
    let mean = d.train_x.iter().map(|&v| v as f64).sum::<f64>() / d.train_x.len() as f64;
    assert!((0.12..0.14).contains(&mean), "mean pixel {mean}");
    // Every test image has ink, and a blank top row (the digits are centred in a 20x20 box).
    for (i, img) in d.test_x.chunks_exact(784).enumerate() {
        assert!(img.iter().any(|&v| v > 0.5), "test image {i} is blank");
        assert!(
            img[..28].iter().all(|&v| v == 0.0),
            "test image {i}: top row"
        );
    }
}
