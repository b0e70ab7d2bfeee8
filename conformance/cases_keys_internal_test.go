package conformance

import "testing"

// keyBatches puts every pair of keys together in some batch, no batch
// larger than the limit.
func TestKeyBatchesCoverEveryPair(t *testing.T) {
	for _, tc := range []struct{ n, limit int }{{48, 2000}, {48, 20}, {48, 7}, {5, 2}, {1, 20}} {
		together := map[[2]int]bool{}
		for _, b := range keyBatches(tc.n, tc.limit) {
			if len(b) > tc.limit {
				t.Fatalf("n=%d limit=%d: a batch of %d", tc.n, tc.limit, len(b))
			}
			for _, i := range b {
				for _, j := range b {
					together[[2]int{i, j}] = true
				}
			}
		}
		for i := range tc.n {
			for j := range tc.n {
				if !together[[2]int{i, j}] {
					t.Fatalf("n=%d limit=%d: keys %d and %d never held together", tc.n, tc.limit, i, j)
				}
			}
		}
	}
}
