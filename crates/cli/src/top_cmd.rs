//! `tenet top`: a coordinator's network on the terminal, live — throughput, queue, jobs in
//! flight, one row per node, the latest slashes, recent jobs — sorted and filtered from the
//! keyboard; or, with `--once`, the same as plain text. Given a node's URL, that node's own
//! view (`node.rs`): its jobs, queue, store and requests, from its public info and metrics.
//!
//! The pieces: `state` is the model (events and listings in, figures out, no I/O), `feed`
//! fills it from the API and the event stream on a thread of its own, `view` draws it. This
//! file holds the arguments and the terminal: raw mode and the alternate screen on the way in,
//! and both undone on every way out — `q`, an error, a signal, or a panic (whose hook restores
//! the terminal before the message is printed).

mod feed;
mod node;
mod state;
mod view;

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use ratatui::Terminal;
use ratatui::backend::CrosstermBackend;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use ratatui::crossterm::{cursor, execute, terminal};

use feed::{Shared, lock};
use state::{Model, ViewState};
use view::Screen;

use crate::coord_cmd::{Client, runtime};

#[derive(clap::Args)]
#[command(
    after_help = "Keys: q, Esc or Ctrl-C quit · s cycles the nodes' sort (stake, score, \
    in-flight, id) · r reverses it · / filters nodes by id, state or device as you type (Enter \
    keeps the filter, Esc clears it) · p pauses the screen · ↑ ↓ (or k j) select a node, whose \
    full id, URL and operator show below the table.\n\n\
    Counts: decided/s is over the last 10 s; in flight is jobs accepted and not decided; queue \
    is jobs waiting for their nodes' commitments; decided and failed count the jobs seen since \
    start and the newest 1000 before it (\"N+\" when there were more); slashed is the ledger's \
    count of disagreements. A node is marked SLASHED once it has been.\n\n\
    Examples:\n  tenet top http://127.0.0.1:7080 --api-key KEY\n  \
    tenet top --once | grep SLASHED"
)]
pub struct TopArgs {
    /// The coordinator's URL (or a node's: then that node's own view).
    #[arg(
        value_name = "URL",
        env = "TENET_COORDINATOR",
        default_value = "http://127.0.0.1:7080"
    )]
    pub url: String,
    /// API key (sent as `authorization: Bearer KEY`); not needed when the coordinator runs
    /// `--open` or `--public-dashboard`.
    #[arg(
        long,
        value_name = "KEY",
        env = "TENET_API_KEY",
        hide_env_values = true
    )]
    pub api_key: Option<String>,
    /// Seconds between polls of the nodes and recent jobs (the event stream is live).
    #[arg(long, value_name = "SECS", default_value_t = 1.0)]
    pub interval: f64,
    /// Print one plain-text snapshot and exit (no screen; for scripts and pipes).
    #[arg(long)]
    pub once: bool,
}

pub fn run(a: &TopArgs) -> Result<()> {
    if !(a.interval >= 0.1 && a.interval <= 3600.0) {
        bail!("--interval takes 0.1 to 3600 seconds, not {}", a.interval);
    }
    let url = a.url.trim_end_matches('/').to_string();
    if !a.once && !std::io::stdout().is_terminal() {
        bail!(
            "standard output is not a terminal: `tenet top` draws a live screen there; \
             pass --once for a plain-text snapshot"
        );
    }
    let key = a.api_key.as_deref();
    let rt = runtime()?;
    // A node's URL: its own, smaller view (what its public info and metrics say).
    if let Some(info) = rt.block_on(node::info_if_node(&url)) {
        return node::run(&rt, &url, info, a.once, Duration::from_secs_f64(a.interval));
    }
    // A first look before anything is drawn: an unreachable coordinator, or one that wants a
    // key, is a plain message on a plain terminal.
    let client = Client::with_optional_key(&url, key)?;
    let mut model = Model::default();
    rt.block_on(feed::first_look(&client, &url, key.is_some(), &mut model))?;
    drop(client);
    if a.once {
        let conn = rt.block_on(feed::read_backlog(
            &mut model,
            &url,
            key,
            Duration::from_millis(300),
            Duration::from_secs(3),
        ))?;
        let now = model.now(feed::now_us());
        print!(
            "{}",
            view::plain(&Screen {
                model: &model,
                view: &ViewState::default(),
                conn: &conn,
                note: None,
                url: &url,
                now_us: now,
            })
        );
        return Ok(());
    }
    let shared = Arc::new(Mutex::new(Shared::new(model)));
    let feed_thread = {
        let (shared, url, key) = (shared.clone(), url.clone(), a.api_key.clone());
        let interval = Duration::from_secs_f64(a.interval);
        std::thread::Builder::new()
            .name("tenet-top-feed".into())
            .spawn(move || rt.block_on(feed::run(shared, url, key, interval)))
            .context("starting the feed thread")?
    };
    let mut term = Tui::enter()?;
    let result = ui(&mut term, &shared, &url, &feed_thread);
    drop(term);
    result
}

/// The next key or resize within one frame, if any.
fn next_key(keys: &std::sync::mpsc::Receiver<std::io::Result<Event>>) -> Result<Option<Event>> {
    match keys.recv_timeout(MIN_FRAME) {
        Ok(ev) => Ok(Some(ev.context("reading the keyboard")?)),
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Ok(None),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            bail!("the keyboard reader stopped")
        }
    }
}

/// Keys, read on a thread of their own: crossterm's poll spins without returning once the
/// terminal is gone (a closed pty reads end-of-file forever), and a screen's loop must stay
/// free to see a signal's quit or a failed draw and end the process.
fn spawn_keys() -> Result<std::sync::mpsc::Receiver<std::io::Result<Event>>> {
    let (keys_tx, keys) = std::sync::mpsc::sync_channel::<std::io::Result<Event>>(64);
    std::thread::Builder::new()
        .name("tenet-top-keys".into())
        .spawn(move || {
            loop {
                let ev = event::read();
                let failed = ev.is_err();
                if keys_tx.send(ev).is_err() || failed {
                    return;
                }
            }
        })
        .context("starting the keyboard reader")?;
    Ok(keys)
}

/// Whether the terminal is in raw mode on the alternate screen (so the panic hook and the
/// guard each restore it once).
static ACTIVE: AtomicBool = AtomicBool::new(false);

fn restore() {
    if ACTIVE.swap(false, Ordering::AcqRel) {
        let _ = terminal::disable_raw_mode();
        let _ = execute!(
            std::io::stdout(),
            cursor::Show,
            terminal::LeaveAlternateScreen
        );
    }
}

/// The terminal, in raw mode on the alternate screen until dropped.
struct Tui {
    terminal: Terminal<CrosstermBackend<std::io::Stdout>>,
}

impl Tui {
    fn enter() -> Result<Tui> {
        static HOOK: Once = Once::new();
        HOOK.call_once(|| {
            let previous = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                restore();
                previous(info);
            }));
        });
        terminal::enable_raw_mode().context("raw mode")?;
        ACTIVE.store(true, Ordering::Release);
        let entered = (|| -> Result<Tui> {
            execute!(
                std::io::stdout(),
                terminal::EnterAlternateScreen,
                cursor::Hide
            )
            .context("the alternate screen")?;
            let terminal = Terminal::new(CrosstermBackend::new(std::io::stdout()))?;
            Ok(Tui { terminal })
        })();
        if entered.is_err() {
            restore();
        }
        entered
    }
}

impl Drop for Tui {
    fn drop(&mut self) {
        restore();
    }
}

/// Redraw at most this often when things change...
const MIN_FRAME: Duration = Duration::from_millis(100);
/// ...and at least this often (ages and rates move on).
const MAX_FRAME: Duration = Duration::from_secs(1);

fn ui(
    term: &mut Tui,
    shared: &Mutex<Shared>,
    url: &str,
    feed_thread: &std::thread::JoinHandle<()>,
) -> Result<()> {
    let mut view = ViewState::default();
    let keys = spawn_keys()?;
    // What a pause froze: the model and its "now".
    let mut frozen: Option<(Model, u64)> = None;
    let mut last_draw: Option<Instant> = None;
    let mut asked = true;
    loop {
        {
            let s = lock(shared);
            if let Some(f) = &s.fatal {
                bail!("{f}");
            }
            if s.quit {
                return Ok(());
            }
        }
        if feed_thread.is_finished() {
            bail!("tenet top: the feed stopped unexpectedly");
        }
        let since = last_draw.map_or(Duration::MAX, |t| t.elapsed());
        let dirty = asked || (lock(shared).dirty && frozen.is_none());
        if (dirty && since >= MIN_FRAME) || since >= MAX_FRAME {
            let mut s = lock(shared);
            s.dirty = false;
            let now = s.model.now(feed::now_us());
            let (model, now) = match &frozen {
                Some((m, t)) => (m, *t),
                None => (&s.model, now),
            };
            // Keep the selection on a node that is shown.
            let rows = model.rows(&view);
            if view.selected_index(&rows).is_none() && view.selected.is_some() {
                view.selected = None;
            }
            drop(rows);
            let screen = Screen {
                model,
                view: &view,
                conn: &s.conn,
                note: s.note.as_deref(),
                url,
                now_us: now,
            };
            term.terminal
                .draw(|f| view::draw(f, &screen))
                .context("drawing")?;
            last_draw = Some(Instant::now());
            asked = false;
        }
        let Some(ev) = next_key(&keys)? else {
            continue;
        };
        match ev {
            Event::Key(k) if k.kind != KeyEventKind::Release => {
                let s = lock(shared);
                let model = frozen.as_ref().map_or(&s.model, |(m, _)| m);
                match key(&mut view, model, k) {
                    Action::Quit => return Ok(()),
                    Action::Pause => {
                        frozen = match frozen {
                            Some(_) => None,
                            None => Some((s.model.clone(), s.model.now(feed::now_us()))),
                        };
                        view.paused = frozen.is_some();
                    }
                    Action::None => {}
                }
                asked = true;
            }
            Event::Resize(..) => asked = true,
            _ => {}
        }
    }
}

enum Action {
    None,
    Pause,
    Quit,
}

/// What a key does to the view.
fn key(view: &mut ViewState, model: &Model, k: KeyEvent) -> Action {
    let ctrl = k.modifiers.contains(KeyModifiers::CONTROL);
    if ctrl && matches!(k.code, KeyCode::Char('c') | KeyCode::Char('d')) {
        return Action::Quit;
    }
    if view.editing {
        match k.code {
            KeyCode::Enter => view.editing = false,
            KeyCode::Esc => {
                view.editing = false;
                view.filter.clear();
            }
            KeyCode::Backspace => {
                view.filter.pop();
            }
            KeyCode::Char(c) if !ctrl && view.filter.len() < 64 => view.filter.push(c),
            _ => {}
        }
        return Action::None;
    }
    let rows = model.rows(view);
    let page = 10;
    match k.code {
        KeyCode::Char('q') | KeyCode::Esc => return Action::Quit,
        KeyCode::Char('s') => view.sort = view.sort.next(),
        KeyCode::Char('r') => view.reverse = !view.reverse,
        KeyCode::Char('/') => {
            view.editing = true;
            view.filter.clear();
        }
        KeyCode::Char('p') => return Action::Pause,
        KeyCode::Down | KeyCode::Char('j') => view.move_selection(&rows, 1),
        KeyCode::Up | KeyCode::Char('k') => view.move_selection(&rows, -1),
        KeyCode::PageDown => view.move_selection(&rows, page),
        KeyCode::PageUp => view.move_selection(&rows, -page),
        KeyCode::Home | KeyCode::Char('g') => view.move_selection(&rows, isize::MIN / 2),
        KeyCode::End | KeyCode::Char('G') => view.move_selection(&rows, isize::MAX / 2),
        _ => {}
    }
    Action::None
}
