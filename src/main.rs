//! The `mpg-gateway` binary: parse the command line, then run the gateway,
//! the demo, a config check, or an admin command.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use mpg_gateway::cli::{self, Cli, Command, Failure};
use mpg_gateway::signals::Signals;
use mpg_gateway::{app, demo, logging};

// mimalloc rather than glibc's malloc: the per-request path allocates and frees
// small objects across tasks, which glibc's allocator (`_int_malloc`,
// `_int_free`, `malloc_consolidate`) makes one of the largest costs under load.
// Its v2 line (Cargo feature `v2`): the `MiMalloc` wrapper asks for every
// block through `mi_malloc_aligned`, and v3 serves any block over 1 KiB whose
// size is not a power of two (a header map's entries, a boxed request future)
// by over-allocating and aligning by hand, four times a request; v2 takes
// its ordinary path for any alignment up to 16.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // aws-lc-rs is rustls's provider throughout: the gateway's own TLS
    // configs name it, and the redis crate builds its `rediss://` config
    // from the process default, installed here so that it never depends on
    // which providers the build happens to compile in.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let cli = Cli::parse_args();
    match cli.command.unwrap_or(Command::Run) {
        Command::Run => run(&cli.config),
        Command::CheckConfig => check_config(&cli.config),
        Command::Demo(args) => {
            logging::init("info", mpg_gateway::config::LogFormat::Text);
            let config = cli.config_named.then_some(cli.config.as_path());
            match runtime(0).and_then(|rt| rt.block_on(demo::run(&args, config))) {
                Ok(()) => ExitCode::SUCCESS,
                Err(f) => {
                    eprintln!("mpg-gateway: {}", f.message);
                    ExitCode::from(f.code)
                }
            }
        }
        cmd => {
            logging::init("warn", mpg_gateway::config::LogFormat::Text);
            let result = cli::load_store_settings(&cli.config).and_then(|settings| {
                runtime(1).and_then(|rt| rt.block_on(cli::admin(&settings, cmd)))
            });
            cli::finish(result)
        }
    }
}

fn runtime(workers: usize) -> Result<tokio::runtime::Runtime, Failure> {
    // One worker: everything on the main thread, with no cross-thread wake-ups
    // between the accept loop (in `block_on`) and the connection tasks.
    let mut b = if workers == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    };
    if workers > 1 {
        b.worker_threads(workers);
    }
    b.enable_all()
        .build()
        .map_err(|e| Failure::runtime(format!("cannot start the runtime: {e}")))
}

fn check_config(path: &std::path::Path) -> ExitCode {
    match cli::load_settings(path).and_then(|s| {
        // Also load the certificates (a key that does not match its cert is a
        // config problem) and parse the Redis url as the limiter will (a
        // cluster's node list included); reported as the file's problems are.
        let problem = |path: &str, message: String| mpg_gateway::config::Problem {
            path: path.to_string(),
            message,
        };
        let mut problems = Vec::new();
        for (name, tls) in [("server.tls", &s.server.tls), ("admin.tls", &s.admin.tls)] {
            if let Some(Err(e)) = tls.as_ref().map(app::load_certified_key) {
                problems.push(problem(name, e.to_string()));
            }
        }
        if let Some(r) = &s.rate_limit.redis {
            let target = mpg_gateway::ratelimit::RedisTarget::new(&r.url, r.ca_file.as_deref());
            if let Err(e) = target {
                problems.push(problem("rate_limit.redis_url", e.to_string()));
            }
        }
        if !problems.is_empty() {
            let file = path.to_path_buf();
            let error = mpg_gateway::config::ConfigError { file, problems };
            return Err(Failure::input(error.to_string()));
        }
        Ok(s)
    }) {
        Ok(s) => {
            if let Some(warning) = s.admin.exposure_warning() {
                eprintln!("{}: warning: {warning}", path.display());
            }
            eprintln!(
                "{}: OK ({} routes, {} upstreams, {} rate-limit policies)",
                path.display(),
                s.routes.len(),
                s.upstreams.len(),
                s.rate_limit.policies.len()
            );
            ExitCode::SUCCESS
        }
        Err(f) => {
            eprintln!("{}", f.message);
            ExitCode::from(f.code)
        }
    }
}

fn run(path: &std::path::Path) -> ExitCode {
    let settings = match cli::load_settings(path) {
        Ok(s) => s,
        Err(f) => {
            eprintln!("{}", f.message);
            return ExitCode::from(f.code);
        }
    };
    logging::init(&settings.log.level, settings.log.format);
    let json_logs = settings.log.format == mpg_gateway::config::LogFormat::Json;
    let rt = match runtime(settings.server.workers) {
        Ok(rt) => rt,
        Err(f) => return cli::finish(Err(f)),
    };
    rt.block_on(async {
        // Before anything slow (the store, its migrations): the default
        // action of SIGHUP and SIGTERM ends the process at once, and systemd
        // may send one as soon as the unit has started (`ExecReload`). From
        // here a SIGHUP is held for the handler below, and a SIGTERM or
        // SIGINT ends a start that is still waiting (e.g. on the store).
        let mut signals = Signals::register();
        let started = tokio::select! {
            started = app::start(settings, Some(path.to_path_buf())) => started,
            () = signals.stop() => {
                tracing::info!("stop signal received while starting; stopped");
                return ExitCode::SUCCESS;
            }
        };
        let running = match started {
            Ok(r) => r,
            Err(e) => {
                // With its causes: "key store unreachable" alone does not
                // tell a refused connection from an untrusted certificate.
                let e = logging::Chain(&e);
                tracing::error!(error = %e, "cannot start");
                // A text log line already says it to the terminal; JSON
                // lines are for a collector, so a person gets one plain line.
                if json_logs {
                    eprintln!("mpg-gateway: {e}");
                }
                return ExitCode::from(1);
            }
        };
        let live = running.live.clone();
        // SIGHUP re-reads the configuration (and certificate) without dropping connections.
        #[cfg(unix)]
        if let Some(mut hup) = signals.take_hup() {
            tokio::spawn(async move {
                while hup.recv().await.is_some() {
                    tracing::info!("SIGHUP received; reloading configuration");
                    let _ = live.reload().await;
                }
            });
        }
        #[cfg(not(unix))]
        drop(live);
        signals.stop().await;
        // The pre-stop window: not ready, still serving, so that a balancer
        // takes the instance out before its listeners close. A second
        // signal cuts it short.
        let delay = running.live.shutdown_delay();
        if !delay.is_zero() {
            running.live.set_stopping();
            tracing::info!(delay = ?delay, "stop signal received; not ready, serving until the drain");
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = signals.stop() => tracing::info!("second stop signal; draining now"),
            }
        }
        tracing::info!("stop signal received; draining");
        running.stop().await;
        tracing::info!("stopped");
        ExitCode::SUCCESS
    })
}
