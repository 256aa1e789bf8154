. /scenario/fuzz.sh
