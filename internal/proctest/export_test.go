package proctest

// RaceEnabled is raceEnabled, for the tests of Build.
const RaceEnabled = raceEnabled
