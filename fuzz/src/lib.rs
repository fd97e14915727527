//! The properties Sluice's fuzz targets check, one function a target.
pub mod checks;
