//! Versioned postcard snapshots (being written).
