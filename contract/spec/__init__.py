"""The contract as versioned data (thresholds and formulas live here, nowhere else)."""
