//! Zipf-distributed ranks in `1..=n`: P(k) is proportional to 1 / k^s.
//!
//! Rejection-inversion sampling (W. Hörmann and G. Derflinger, "Rejection-inversion to
//! generate variates from monotone discrete distributions", 1996), as in Apache
//! Commons RNG: O(1) expected time and no table, so `n` can be millions of keys.

use rand::Rng;

#[derive(Debug, Clone)]
pub struct Zipf {
    n: f64,
    s: f64,
    h_integral_x1: f64,
    h_integral_n: f64,
    threshold: f64,
}

impl Zipf {
    /// `n >= 1` ranks with exponent `s > 0`.
    pub fn new(n: u64, s: f64) -> anyhow::Result<Zipf> {
        anyhow::ensure!(n >= 1, "zipf needs at least one key");
        anyhow::ensure!(s > 0.0 && s.is_finite(), "--zipf-s must be > 0");
        let n = n as f64;
        let mut z = Zipf {
            n,
            s,
            h_integral_x1: 0.0,
            h_integral_n: 0.0,
            threshold: 0.0,
        };
        z.h_integral_x1 = z.h_integral(1.5) - 1.0;
        z.h_integral_n = z.h_integral(n + 0.5);
        z.threshold = 2.0 - z.h_integral_inverse(z.h_integral(2.5) - z.h(2.0));
        Ok(z)
    }

    /// A rank in `1..=n`; rank 1 is the most frequent.
    pub fn sample(&self, rng: &mut impl Rng) -> u64 {
        loop {
            let u =
                self.h_integral_n + rng.random::<f64>() * (self.h_integral_x1 - self.h_integral_n);
            let x = self.h_integral_inverse(u);
            let k = (x + 0.5).floor().clamp(1.0, self.n);
            if k - x <= self.threshold || u >= self.h_integral(k + 0.5) - self.h(k) {
                return k as u64;
            }
        }
    }

    fn h(&self, x: f64) -> f64 {
        (-self.s * x.ln()).exp()
    }

    fn h_integral(&self, x: f64) -> f64 {
        let log_x = x.ln();
        helper2((1.0 - self.s) * log_x) * log_x
    }

    fn h_integral_inverse(&self, x: f64) -> f64 {
        let t = (x * (1.0 - self.s)).max(-1.0);
        (helper1(t) * x).exp()
    }
}

/// ln(1 + x) / x, accurate near 0.
fn helper1(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.ln_1p() / x
    } else {
        1.0 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x))
    }
}

/// (e^x - 1) / x, accurate near 0.
fn helper2(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.exp_m1() / x
    } else {
        1.0 + x * 0.5 * (1.0 + x / 3.0 * (1.0 + 0.25 * x))
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;

    fn check(n: u64, s: f64) {
        let z = Zipf::new(n, s).unwrap();
        let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
        let draws = 400_000;
        let mut counts = vec![0u64; n as usize];
        for _ in 0..draws {
            let k = z.sample(&mut rng);
            assert!((1..=n).contains(&k));
            counts[(k - 1) as usize] += 1;
        }
        let norm: f64 = (1..=n).map(|k| (k as f64).powf(-s)).sum();
        for (i, &c) in counts.iter().enumerate() {
            let p = ((i + 1) as f64).powf(-s) / norm;
            let expected = p * draws as f64;
            let sd = (expected * (1.0 - p)).sqrt();
            assert!(
                (c as f64 - expected).abs() < 5.0 * sd + 1.0,
                "n={n} s={s} rank {}: {c} draws, expected {expected:.0}",
                i + 1
            );
        }
    }

    #[test]
    fn frequencies_follow_zipf() {
        check(1, 1.0);
        check(10, 1.0);
        check(20, 0.8);
        check(50, 1.3);
        check(5, 2.5);
    }

    #[test]
    fn refuses_bad_parameters() {
        assert!(Zipf::new(0, 1.0).is_err());
        assert!(Zipf::new(10, 0.0).is_err());
        assert!(Zipf::new(10, f64::NAN).is_err());
    }
}
