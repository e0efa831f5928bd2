//! A small content-addressed cache that forgets its least recently used entries once their
//! total weight (a count, or bytes) passes a capacity.

use std::collections::HashMap;
use std::sync::Arc;

use tenet_proto::Hash;

pub struct Lru<V> {
    map: HashMap<Hash, (u64, u64, Arc<V>)>,
    clock: u64,
    weight: u64,
    capacity: u64,
}

impl<V> Lru<V> {
    pub fn new(capacity: u64) -> Lru<V> {
        Lru {
            map: HashMap::new(),
            clock: 0,
            weight: 0,
            capacity,
        }
    }

    pub fn get(&mut self, k: &Hash) -> Option<Arc<V>> {
        self.clock += 1;
        let now = self.clock;
        self.map.get_mut(k).map(|(t, _, v)| {
            *t = now;
            v.clone()
        })
    }

    /// Whether `k` is kept (without marking it used).
    pub fn contains(&self, k: &Hash) -> bool {
        self.map.contains_key(k)
    }

    pub fn remove(&mut self, k: &Hash) {
        if let Some((_, w, _)) = self.map.remove(k) {
            self.weight -= w;
        }
    }

    /// Keep `v` unless it alone outweighs the whole cache.
    pub fn insert(&mut self, k: Hash, v: Arc<V>, weight: u64) {
        if weight > self.capacity {
            return;
        }
        self.remove(&k);
        while self.weight + weight > self.capacity {
            let Some(oldest) = self
                .map
                .iter()
                .min_by_key(|(_, (t, _, _))| *t)
                .map(|(k, _)| *k)
            else {
                break;
            };
            self.remove(&oldest);
        }
        self.clock += 1;
        self.weight += weight;
        self.map.insert(k, (self.clock, weight, v));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn least_recently_used_entries_go_first_by_weight() {
        let mut c = Lru::new(10);
        let h = |n: u8| Hash([n; 32]);
        c.insert(h(1), Arc::new(1), 4);
        c.insert(h(2), Arc::new(2), 4);
        c.get(&h(1));
        c.insert(h(3), Arc::new(3), 4);
        assert!(c.get(&h(2)).is_none(), "2 was least recently used");
        assert!(c.get(&h(1)).is_some() && c.get(&h(3)).is_some());
        c.insert(h(4), Arc::new(4), 11);
        assert!(c.get(&h(4)).is_none(), "heavier than the cache: not kept");
        c.insert(h(1), Arc::new(5), 2);
        assert_eq!(*c.get(&h(1)).unwrap(), 5);
        assert_eq!(c.weight, 6);
        c.remove(&h(3));
        assert!(c.get(&h(3)).is_none());
        assert_eq!(c.weight, 2);
    }
}
