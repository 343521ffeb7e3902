package consumer

// testHooks are signals compiled into the runtime so tests wait on events
// instead of sleeping. They are set only by this package's tests.
type testHooks struct {
	consuming    func()
	reconnecting func(err error)
	settled      func(queue, outcome string)
	// frameMax, if set, replaces the publishing connection's frame_max in
	// quarantine.Fit.
	frameMax int
	// keeper runs the quarantine keepers under test hooks. Without it the
	// intake keeps what arrives, for the tests that read it directly.
	keeper bool
}
