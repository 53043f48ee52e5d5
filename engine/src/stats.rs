//! Statistics of a tensor's dequantized values (what the workbench's detail panel shows):
//! min, max, mean, standard deviation, zeros, NaN/Inf, outliers and a histogram. Decodes
//! one row at a time (memory bounded by a row) in two passes, and checks a cancel flag
//! between rows.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::format::DType;
use crate::quant;

/// Bins of the histogram.
pub const BINS: usize = 64;
/// A value further than this many standard deviations from the mean is an outlier.
pub const OUTLIER_SIGMAS: f64 = 6.0;

#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct TensorStats {
    pub count: u64,
    /// Over finite values.
    pub min: f32,
    pub max: f32,
    pub mean: f64,
    pub std: f64,
    pub zeros: u64,
    pub nan: u64,
    pub inf: u64,
    pub outliers: u64,
    /// Counts of finite values in `BINS` equal bins over `[min, max]`.
    pub histogram: Vec<u64>,
}

#[derive(Debug, PartialEq, Eq)]
pub enum StatsError {
    Cancelled,
    Decode(String),
}

impl std::fmt::Display for StatsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StatsError::Cancelled => f.write_str("cancelled"),
            StatsError::Decode(e) => f.write_str(e),
        }
    }
}

/// Computes the statistics of one stored tensor.
pub fn tensor_stats(
    dtype: DType,
    shape: &[u64],
    bytes: &[u8],
    cancel: &AtomicBool,
) -> Result<TensorStats, StatsError> {
    let g = quant::geometry(dtype, shape).map_err(|e| StatsError::Decode(e.to_string()))?;
    quant::validate(dtype, shape, bytes).map_err(|e| StatsError::Decode(e.to_string()))?;
    let mut row = vec![0f32; g.cols];
    let rows = g.rows;
    let each_row = |row: &mut Vec<f32>, f: &mut dyn FnMut(&[f32])| -> Result<(), StatsError> {
        for r in 0..rows {
            if cancel.load(Ordering::Relaxed) {
                return Err(StatsError::Cancelled);
            }
            quant::decode_row(dtype, shape, bytes, r, row)
                .map_err(|e| StatsError::Decode(e.to_string()))?;
            f(row);
        }
        Ok(())
    };
    // Pass 1: moments, extremes, special values.
    let (mut count, mut zeros, mut nan, mut inf) = (0u64, 0u64, 0u64, 0u64);
    let (mut min, mut max) = (f32::INFINITY, f32::NEG_INFINITY);
    let (mut sum, mut sumsq) = (0f64, 0f64);
    each_row(&mut row, &mut |vals| {
        for &v in vals {
            count += 1;
            if v.is_nan() {
                nan += 1;
            } else if v.is_infinite() {
                inf += 1;
            } else {
                zeros += (v == 0.0) as u64;
                min = min.min(v);
                max = max.max(v);
                sum += v as f64;
                sumsq += (v as f64) * (v as f64);
            }
        }
    })?;
    let finite = count - nan - inf;
    let mean = if finite > 0 { sum / finite as f64 } else { 0.0 };
    let var = if finite > 0 {
        (sumsq / finite as f64 - mean * mean).max(0.0)
    } else {
        0.0
    };
    let std = var.sqrt();
    // Pass 2: histogram and outliers (they need min, max, mean and std).
    let mut histogram = vec![0u64; BINS];
    let mut outliers = 0u64;
    if finite > 0 {
        let span = (max - min) as f64;
        each_row(&mut row, &mut |vals| {
            for &v in vals.iter().filter(|v| v.is_finite()) {
                let x = v as f64;
                let b = if span > 0.0 {
                    (((x - min as f64) / span) * BINS as f64) as usize
                } else {
                    0
                };
                histogram[b.min(BINS - 1)] += 1;
                outliers += (std > 0.0 && (x - mean).abs() > OUTLIER_SIGMAS * std) as u64;
            }
        })?;
    } else {
        min = 0.0;
        max = 0.0;
    }
    Ok(TensorStats {
        count,
        min,
        max,
        mean,
        std,
        zeros,
        nan,
        inf,
        outliers,
        histogram,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_of_known_values() {
        let vals: Vec<f32> = (0..64)
            .map(|i| if i == 5 { 0.0 } else { i as f32 })
            .collect();
        let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        let s = tensor_stats(DType::F32, &[2, 32], &bytes, &AtomicBool::new(false)).unwrap();
        assert_eq!(s.count, 64);
        assert_eq!(s.zeros, 2);
        assert_eq!((s.min, s.max), (0.0, 63.0));
        let mean = vals.iter().map(|&v| v as f64).sum::<f64>() / 64.0;
        assert!((s.mean - mean).abs() < 1e-9);
        assert_eq!(s.histogram.iter().sum::<u64>(), 64);
        assert_eq!(s.histogram[BINS - 1], 1);
        let mut with_nan = bytes.clone();
        with_nan[8..12].copy_from_slice(&f32::NAN.to_le_bytes());
        with_nan[12..16].copy_from_slice(&f32::INFINITY.to_le_bytes());
        let s = tensor_stats(DType::F32, &[2, 32], &with_nan, &AtomicBool::new(false)).unwrap();
        assert_eq!((s.nan, s.inf), (1, 1));
        assert_eq!(s.histogram.iter().sum::<u64>(), 62);
        assert_eq!(
            tensor_stats(DType::F32, &[2, 32], &bytes, &AtomicBool::new(true)),
            Err(StatsError::Cancelled)
        );
        assert!(matches!(
            tensor_stats(DType::F32, &[2, 32], &bytes[..10], &AtomicBool::new(false)),
            Err(StatsError::Decode(_))
        ));
    }
}
