//! The store's contract: verified, atomic, persistent, LRU-bounded.

use super::*;

fn config(quota: u64) -> StoreConfig {
    StoreConfig {
        quota_bytes: quota,
        max_blob_bytes: 1 << 20,
        durable: true,
        max_pending_bytes: 4 << 20,
    }
}

#[test]
fn blobs_are_verified_and_survive_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(dir.path(), config(1 << 20)).unwrap();
    let h = s.put_bytes(b"hello").unwrap();
    assert_eq!(s.get(&h).unwrap(), b"hello");
    assert!(s.put(&h, b"hello").unwrap(), "a second upload is a no-op");
    let wrong = s.put(&Hash::of(b"other"), b"hello").unwrap_err();
    assert!(matches!(wrong, StoreError::HashMismatch { .. }));
    assert!(s.contains(&Hash::of(b"other")).is_none());
    drop(s);
    let s = Store::open(dir.path(), config(1 << 20)).unwrap();
    assert_eq!(s.get(&h).unwrap(), b"hello");
    assert_eq!(s.stats().blobs, 1);
}

#[test]
fn unfinished_or_short_writes_are_never_visible() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(dir.path(), config(1 << 20)).unwrap();
    let data = vec![7u8; 5000];
    let h = Hash::of(&data);
    let mut w = s.writer(h, Some(5000)).unwrap();
    w.write(&data[..100]).unwrap();
    assert!(matches!(
        w.finish(),
        Err(StoreError::Truncated { got: 100, .. })
    ));
    let mut w = s.writer(h, None).unwrap();
    w.write(&data[..100]).unwrap();
    drop(w);
    assert!(s.contains(&h).is_none());
    assert_eq!(fs::read_dir(dir.path().join("tmp")).unwrap().count(), 0);
    // A leftover from a killed process is removed on open.
    fs::write(dir.path().join("tmp").join("123-0-abc"), &data[..10]).unwrap();
    drop(s);
    let s = Store::open(dir.path(), config(1 << 20)).unwrap();
    assert_eq!(fs::read_dir(dir.path().join("tmp")).unwrap().count(), 0);
    assert!(s.contains(&h).is_none());
    assert_eq!(s.stats().bytes, 0);
}

#[test]
fn least_recently_used_unpinned_blobs_are_evicted_under_the_quota() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(dir.path(), config(3000)).unwrap();
    let blob = |b: u8| vec![b; 1000];
    let a = s.put_bytes(&blob(1)).unwrap();
    let b = s.put_bytes(&blob(2)).unwrap();
    let c = s.put_bytes(&blob(3)).unwrap();
    s.pin(&a).unwrap();
    s.get(&b).unwrap(); // b is now more recent than c
    let d = s.put_bytes(&blob(4)).unwrap();
    assert!(s.contains(&c).is_none(), "c was least recently used");
    assert!(s.contains(&a).is_some() && s.contains(&b).is_some() && s.contains(&d).is_some());
    let held = s.hold(&b).unwrap();
    s.put_bytes(&blob(5)).unwrap();
    assert!(
        s.contains(&d).is_none(),
        "b is held and a pinned, so d goes"
    );
    assert!(s.contains(&b).is_some());
    drop(held);
    let too_big = s.put_bytes(&vec![0u8; 2 << 20]).unwrap_err();
    assert!(matches!(too_big, StoreError::TooLarge { .. }));
    // Pins persist across reopening; with only pinned blobs left there is no room.
    drop(s);
    let s = Store::open(dir.path(), config(1000)).unwrap();
    assert_eq!(s.stats().pinned, 1);
    assert_eq!(s.stats().blobs, 3, "reopening does not evict");
    assert!(matches!(
        s.put_bytes(&blob(9)),
        Err(StoreError::Full { .. })
    ));
    assert!(s.contains(&a).is_some());
    assert_eq!(
        s.stats().blobs,
        3,
        "nothing is evicted for room that evicting everything unpinned could not make"
    );
}

fn tmp_files(dir: &Path) -> usize {
    fs::read_dir(dir.join("tmp")).unwrap().count()
}

/// Issue 29, item 10: uploads that declare a length and send nothing held quota and evicted
/// every unpinned blob, and real uploads failed while they stayed open.
#[test]
fn a_declared_length_alone_reserves_nothing_and_evicts_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(dir.path(), config(3000)).unwrap();
    let kept: Vec<Hash> = (1..=3u8)
        .map(|b| s.put_bytes(&[b; 1000]).unwrap())
        .collect();
    // Four uploads that each promise as much as the whole quota, with no bytes yet.
    let promised: Vec<BlobWriter> = (0..4u8)
        .map(|i| s.writer(Hash::of(&[i]), Some(3000)).unwrap())
        .collect();
    assert!(
        kept.iter().all(|h| s.contains(h).is_some()),
        "nothing evicted"
    );
    // A real upload still succeeds, evicting only what its own bytes need (the oldest blob).
    let fresh = s.put_bytes(&[9; 1000]).unwrap();
    assert!(s.contains(&fresh).is_some());
    assert!(s.contains(&kept[0]).is_none());
    assert!(s.contains(&kept[1]).is_some() && s.contains(&kept[2]).is_some());
    assert_eq!(tmp_files(dir.path()), 4);
    drop(promised);
    assert_eq!(tmp_files(dir.path()), 0);
    // A length beyond the quota or the blob limit is refused before anything is written.
    assert!(matches!(
        s.writer(Hash::of(b"x"), Some(3001)),
        Err(StoreError::Full { .. })
    ));
    assert!(matches!(
        s.writer(Hash::of(b"x"), Some(2 << 20)),
        Err(StoreError::TooLarge { .. })
    ));
}

#[test]
fn room_is_taken_as_bytes_arrive_and_writes_in_progress_are_bounded_together() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(
        dir.path(),
        StoreConfig {
            max_pending_bytes: 1500,
            ..config(3000)
        },
    )
    .unwrap();
    let kept: Vec<Hash> = (1..=3u8)
        .map(|b| s.put_bytes(&[b; 1000]).unwrap())
        .collect();
    let data = [7u8; 1000];
    let mut w = s.writer(Hash::of(&data), Some(1000)).unwrap();
    w.write(&data[..400]).unwrap();
    // The bytes that arrived needed room: the least recently used blob made it.
    assert!(s.contains(&kept[0]).is_none());
    assert!(s.contains(&kept[1]).is_some());
    let mut other = s.writer(Hash::of(b"other"), None).unwrap();
    other.write(&[1; 500]).unwrap();
    let busy = other.write(&[1; 600]).unwrap_err();
    assert!(
        matches!(busy, StoreError::Busy { max: 1500, .. }),
        "{busy:?}"
    );
    assert!(busy.to_string().contains("try again"));
    drop(other);
    w.write(&data[400..]).unwrap();
    assert!(!w.finish().unwrap());
    assert_eq!(s.get(&Hash::of(&data)).unwrap(), data);
    assert_eq!(tmp_files(dir.path()), 0);
}

#[test]
fn computed_blobs_are_joined_from_parts_and_kept_under_the_callers_address() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(dir.path(), config(1 << 20)).unwrap();
    let (head, data) = (b"f32[3]\0".as_slice(), [1u8; 12].as_slice());
    let whole = [head, data].concat();
    let h = Hash::of(&whole);
    assert!(!s.put_computed(&h, &[head, data]).unwrap());
    assert_eq!(s.get(&h).unwrap(), whole);
    assert!(s.put_computed(&h, &[head, data]).unwrap(), "already stored");
    // Too large for the store: refused, and nothing left behind.
    let big = vec![0u8; (1 << 20) + 1];
    assert!(matches!(
        s.put_computed(&Hash::of(&big), &[&big]),
        Err(StoreError::TooLarge { .. })
    ));
    assert_eq!(fs::read_dir(dir.path().join("tmp")).unwrap().count(), 0);
    drop(s);
    let s = Store::open(dir.path(), config(1 << 20)).unwrap();
    assert_eq!(s.get(&h).unwrap(), whole);
}
