//! Uncompiled policy documents, as parsed from either YAML form (placeholder).
