//! libFuzzer's driver of the `target_router` target (`src/target_router.rs` says what it checks).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mpg_gateway_fuzz::target_router::run(data));
