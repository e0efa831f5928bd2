//! The event log every tenet service may keep: one JSON object per line for every request,
//! job phase and network event, written by a background thread so requests never wait on
//! the disk.

use std::io::Write;
use std::path::Path;
use std::sync::Mutex;
use std::sync::mpsc;

/// Microseconds since the Unix epoch.
pub fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// Where event lines go, if anywhere.
pub struct EventLog {
    tx: Mutex<Option<mpsc::Sender<String>>>,
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl EventLog {
    /// No log.
    pub fn off() -> EventLog {
        EventLog {
            tx: Mutex::new(None),
            writer: Mutex::new(None),
        }
    }

    /// Append lines to `path` (`-` = standard error).
    pub fn open(path: &Path) -> std::io::Result<EventLog> {
        let out: Box<dyn Write + Send> = if path == Path::new("-") {
            Box::new(std::io::stderr())
        } else {
            Box::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)?,
            )
        };
        let (tx, rx) = mpsc::channel::<String>();
        let writer = std::thread::Builder::new()
            .name("tenet-event-log".into())
            .spawn(move || {
                let mut buf = std::io::BufWriter::new(out);
                while let Ok(line) = rx.recv() {
                    let _ = writeln!(buf, "{line}");
                    // Drain what is queued, then flush once: lines reach the file promptly
                    // without a write per line under load.
                    while let Ok(line) = rx.try_recv() {
                        let _ = writeln!(buf, "{line}");
                    }
                    let _ = buf.flush();
                }
            })?;
        Ok(EventLog {
            tx: Mutex::new(Some(tx)),
            writer: Mutex::new(Some(writer)),
        })
    }

    /// Log one event: `event` names it, `fields` (a JSON object) add to it, with a timestamp.
    pub fn emit(&self, event: &str, fields: serde_json::Value) {
        let Ok(tx) = self.tx.lock() else { return };
        let Some(tx) = tx.as_ref() else { return };
        let mut obj = serde_json::Map::new();
        obj.insert("ts_us".into(), now_us().into());
        obj.insert("event".into(), event.into());
        if let serde_json::Value::Object(f) = fields {
            obj.extend(f);
        }
        let _ = tx.send(serde_json::Value::Object(obj).to_string());
    }

    /// Log a line made elsewhere (already a JSON object with its timestamp).
    pub fn emit_line(&self, line: String) {
        let Ok(tx) = self.tx.lock() else { return };
        if let Some(tx) = tx.as_ref() {
            let _ = tx.send(line);
        }
    }

    pub fn enabled(&self) -> bool {
        self.tx.lock().is_ok_and(|t| t.is_some())
    }

    /// Write out everything logged so far and stop the writer.
    pub fn close(&self) {
        if let Ok(mut tx) = self.tx.lock() {
            tx.take();
        }
        if let Some(h) = self.writer.lock().ok().and_then(|mut w| w.take()) {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_lines_are_json_and_all_reach_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        let log = EventLog::open(&path).unwrap();
        for i in 0..100 {
            log.emit(
                "job",
                serde_json::json!({"job": format!("j{i}"), "phase": "queued"}),
            );
        }
        log.close();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 100);
        assert_eq!(lines[99]["job"], "j99");
        assert!(lines[0]["ts_us"].as_u64().unwrap() > 0);
    }
}
