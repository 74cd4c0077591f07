//! The config loader: any text, valid TOML or not, gives settings or a list
//! of problems, never a panic; every problem says something.

use mpg_gateway::config::Settings;

/// One input.
pub fn run(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(problems) = Settings::parse(text) {
        assert!(!problems.is_empty());
        assert!(problems.iter().all(|p| !p.message.is_empty()));
    }
}
