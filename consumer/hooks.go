package consumer

// testHooks are signals compiled into the runtime so tests wait on events
// instead of sleeping. They are set only by this package's tests, which
// learn outcomes through Config.OnSettled, as users do.
type testHooks struct {
	consuming    func()
	reconnecting func(err error)
}
