package sqltable

import "github.com/go-locker/locker/sqltable/internal/drivers"

// The view of drivers.Peek, for the tests of the driver packages.
func init() {
	drivers.Peek.HubKey = func(l any) string { return l.(*Locker).hubKey }
	drivers.Peek.Watch = func(table, key string) (<-chan struct{}, func()) {
		w := procHub.watch(table, key)
		return w.c, func() { procHub.leave(w, false) }
	}
	drivers.Peek.Waiting = func(table, key string) bool {
		procHub.mu.Lock()
		defer procHub.mu.Unlock()
		return len(procHub.keys[hubID(table, key)]) > 0
	}
	drivers.Peek.Claimed = func(h any) bool { return h.(*Handle).c.Claimed() }
	drivers.Peek.SetKeepHook = func(f func(h any)) {
		if f == nil {
			testHookKeep = nil
			return
		}
		testHookKeep = func(h *Handle) { f(h) }
	}
}
