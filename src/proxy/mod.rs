//! Forwarding (DESIGN.md §5): header hygiene and the upstream client.
pub mod headers;
pub mod upstream;
