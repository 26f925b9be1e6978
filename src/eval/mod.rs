//! Perplexity / KL-divergence evaluation (in progress).
